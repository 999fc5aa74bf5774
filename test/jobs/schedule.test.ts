/**
 * The schedule: node-cron runs a sweep every SWEEP_INTERVAL_SECONDS (on the system clock, as in
 * production), every job logs its line, and closing it stops the ticks and waits for a sweep in progress.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import cron from 'node-cron';
import { buildContainer, TOKENS } from '../../src/container.ts';
import { systemClock } from '../../src/core/clock.ts';
import { startJobs } from '../../src/daemons/jobs.ts';
import { cronExpression } from '../../src/jobs/schedule.ts';
import type { LogLine } from '../../src/log.ts';
import type { Database } from '../../src/storage/database.ts';
import { type Harness, startHarness } from '../support/harness.ts';

let h: Harness;
before(async () => {
  h = await startHarness({ SWEEP_INTERVAL_SECONDS: '1' });
});
after(() => h.close());

test('each allowed interval becomes a cron expression that fires at that interval', () => {
  const cases: [number, string][] = [
    [1, '*/1 * * * * *'],
    [15, '*/15 * * * * *'],
    [60, '0 */1 * * * *'],
    [300, '0 */5 * * * *'],
    [3600, '0 0 */1 * * *'],
    [21600, '0 0 */6 * * *'],
    [86400, '0 0 0 * * *'],
  ];
  for (const [seconds, expression] of cases) {
    assert.equal(cronExpression(seconds), expression);
    assert.equal(cron.validate(expression), true, expression);
  }
});

test('with SWEEP_INTERVAL_SECONDS=1 node-cron runs the sweep within seconds, and close stops it', async () => {
  const lines: LogLine[] = [];
  const log = (line: LogLine) => lines.push(line);
  // A process of its own: the system clock, its own pool and log.
  const container = buildContainer(h.config, { clock: systemClock, log, poolSize: 3 });
  const started = Date.now();
  const schedule = startJobs(container, log);
  try {
    const ran = () => new Set(lines.filter((l) => l.msg === 'job ran').map((l) => l.job));
    while (ran().size < 8 && Date.now() - started < 5000) await sleep(50);
    assert.deepEqual(
      [...ran()].sort(),
      [
        'delete-messages',
        'drop-rate-buckets',
        'drop-rejections',
        'drop-tombstones',
        'expire-inboxes',
        'forget-idempotency',
        'purge-inboxes',
        'release-reservations',
      ],
      JSON.stringify(lines),
    );
    process.stdout.write(`# first sweep logged ${Date.now() - started} ms after the schedule started\n`);
  } finally {
    await schedule.close();
  }
  const count = lines.length;
  await sleep(1500);
  assert.equal(lines.length, count, 'no sweep after close');
  await container.resolve<Database>(TOKENS.Database).close();
});
