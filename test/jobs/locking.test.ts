/**
 * One run of a job at a time across processes (STYLE 17): each job takes a Postgres advisory lock named
 * after it, so a second process (here: a second container with its own pool) skips the run while the
 * first holds it. A run that fails releases its lock, logs an error line and leaves no half-done batch.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { after, before, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import type { DependencyContainer } from 'tsyringe';
import { buildContainer, TOKENS } from '../../src/container.ts';
import { newMessageId } from '../../src/core/ids.ts';
import type { SweeperStore } from '../../src/core/ports.ts';
import { EXPIRE_SETTLE_SECONDS } from '../../src/jobs/expire-inboxes.ts';
import { defineJob, type JobReport } from '../../src/jobs/job.ts';
import { sweepLimits } from '../../src/jobs/jobs.ts';
import type { LogLine } from '../../src/log.ts';
import type { Database } from '../../src/storage/database.ts';
import { PgSweeperStore } from '../../src/storage/sweeper-store.ts';
import { type Harness, startHarness } from '../support/harness.ts';
import { deliverMany, footprint, scalar, testJobs } from '../support/jobs.ts';
import { untilWaiting } from '../support/lock-waits.ts';

let h: Harness;
let other: DependencyContainer;
before(async () => {
  h = await startHarness();
  other = buildContainer(h.config, { clock: h.clock, log: () => {}, poolSize: 5 });
});
after(async () => {
  await other.resolve<Database>(TOKENS.Database).close();
  await h.close();
});

const otherProcess = () => ({ container: other, clock: h.clock, config: h.config });

test('a job whose lock another process holds is skipped, logs that, and changes nothing', async () => {
  const inbox = await h.provision();
  await h.deliver(inbox.inbox_id, 'Subject: x\r\n\r\nx\r\n');
  h.clock.advance(h.config.unitSeconds + EXPIRE_SETTLE_SECONDS + 1);
  const jobs = testJobs(h);
  const held = other.resolve<SweeperStore>(TOKENS.SweeperStore);

  let skipped: JobReport | undefined;
  const outcome = await held.exclusively('expire-inboxes', async () => {
    skipped = await jobs.run('expire-inboxes');
  });
  assert.equal(outcome.ran, true);
  assert.equal(skipped?.ran, false);
  assert.equal(skipped?.complete, false);
  assert.deepEqual(jobs.lines.at(-1), {
    msg: 'job skipped: running in another process',
    job: 'expire-inboxes',
    batches: 0,
    complete: false,
    duration_ms: jobs.lines.at(-1)?.duration_ms,
  });
  assert.equal((await footprint(h, inbox.inbox_id)).undeleted, 1);

  // Other jobs have locks of their own; and once released, this one runs.
  const meanwhile = await held.exclusively('expire-inboxes', () => jobs.run('drop-tombstones'));
  assert.equal(meanwhile.ran && meanwhile.value.ran, true);
  const ran = await jobs.run('expire-inboxes');
  assert.equal(ran.ran, true);
  assert.equal(ran.counts.messages, 1);
});

test('a process that froze holding a lock holds it no longer than the lease, and the job runs elsewhere', async () => {
  const lease = 1_500;
  const holder = spawn(
    process.execPath,
    ['test/support/hold-job-lock.ts', h.database.url, 'drop-tombstones', String(lease)],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  try {
    const [said] = (await once(holder.stdout, 'data')) as [Buffer];
    assert.equal(said.toString(), 'locked\n');
    // Frozen: its kernel still answers for its connection, but its event loop renews nothing.
    holder.kill('SIGSTOP');
    const jobs = testJobs(h);
    assert.equal((await jobs.run('drop-tombstones')).ran, false, 'within the lease the lock holds');
    const started = Date.now();
    let ran = false;
    while (!ran && Date.now() - started < 4 * lease) {
      await sleep(100);
      ran = (await jobs.run('drop-tombstones')).ran;
    }
    assert.ok(ran, 'the job ran in this process once the lease was over');
  } finally {
    holder.kill('SIGKILL');
  }
});

test('a lock held past its lease by a process that is alive stays held', async () => {
  const lease = 600;
  const store = new PgSweeperStore(h.container.resolve<Database>(TOKENS.Database), { lockLeaseMs: lease });
  const jobs = testJobs(h);
  const outcome = await store.exclusively('drop-tombstones', async () => {
    await sleep(3 * lease);
    return (await jobs.run('drop-tombstones')).ran;
  });
  assert.deepEqual(outcome, { ran: true, value: false });
  // Back in the pool, its connection is not ended for idling.
  assert.equal((await jobs.run('drop-tombstones')).ran, true);
});

test('two processes sweeping at the same time do each piece of work once', async () => {
  const inboxes = [await h.provision(), await h.provision(), await h.provision()];
  await deliverMany(
    h,
    inboxes.map((i) => i.inbox_id),
    120,
    (i) => `Subject: ${i}\r\n\r\nmessage ${i}\r\n`,
  );
  h.clock.advance(h.config.unitSeconds + h.config.purgeAfterSeconds);
  const a = testJobs(h, { batchRows: 10 });
  const b = testJobs(otherProcess(), { batchRows: 10 });
  const [ra, rb] = await Promise.all([a.sweep(), b.sweep()]);
  const lines: LogLine[] = [...a.lines, ...b.lines];
  assert.equal(lines.length, 16, 'one line per job per process');
  // A purge that ran while the other process was still expiring leaves that inbox to the next sweep;
  // over both sweeps and one more, each piece of work is done exactly once.
  const rc = await a.sweep();
  const total = (job: string, count: string) =>
    [...ra, ...rb, ...rc].filter((r) => r.job === job).reduce((sum, r) => sum + (r.counts[count] ?? 0), 0);
  assert.equal(total('expire-inboxes', 'messages'), 120);
  // The first test's inbox is due by now too.
  assert.equal(total('purge-inboxes', 'inboxes'), 4);
  for (const inbox of inboxes) assert.equal((await footprint(h, inbox.inbox_id)).inboxes, 0);
});

test('a run that fails logs an error line with its counts so far and releases its lock', async () => {
  const lines: LogLine[] = [];
  const store = h.container.resolve<SweeperStore>(TOKENS.SweeperStore);
  const failing = defineJob(
    'failing-job',
    { store, clock: h.clock, log: (l) => lines.push(l), limits: sweepLimits(h.config), settings: h.config },
    async (run) => {
      await run.repeat(async () => {
        run.add({ things: 2 });
        return false;
      });
      throw new Error('database went away');
    },
  );
  const report = await failing.run();
  assert.equal(report.ran, true);
  assert.equal(report.complete, false);
  assert.equal(report.error, 'database went away');
  assert.equal(lines[0]?.level, 'error');
  assert.equal(lines[0]?.msg, 'job failed');
  assert.equal(lines[0]?.things, 2);
  const again = await other
    .resolve<SweeperStore>(TOKENS.SweeperStore)
    .exclusively('failing-job', async () => 1);
  assert.deepEqual(again, { ran: true, value: 1 }, 'the lock was released');
});

test("a run whose lock's session fails stops before its next batch and is reported failed", async () => {
  // Jobs review: the run went on without the lock (another process could take it meanwhile).
  const lines: LogLine[] = [];
  const store = h.container.resolve<SweeperStore>(TOKENS.SweeperStore);
  let batches = 0;
  const job = defineJob(
    'lock-lost-job',
    { store, clock: h.clock, log: (l) => lines.push(l), limits: sweepLimits(h.config), settings: h.config },
    async (run) => {
      await run.repeat(async () => {
        batches++;
        if (batches === 1) {
          // The session holding this job's advisory lock ends, as when a renewal cannot reach PostgreSQL.
          // pg_locks is the cluster's: only this file's database, not other test files' locks.
          const advisory = `FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid()
            AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`;
          assert.equal(await scalar(h, `SELECT count(pg_terminate_backend(pid)) ${advisory}`), 1);
          const until = Date.now() + 5000;
          while (Date.now() < until && (await scalar(h, `SELECT count(*) ${advisory}`)) > 0) await sleep(10);
          await sleep(100);
        }
        return batches < 5;
      });
    },
  );
  const report = await job.run();
  assert.equal(batches, 1, 'no batch after the lock was lost');
  assert.equal(report.complete, false);
  assert.match(report.error ?? '', /^lost the job's lock: /);
  assert.equal(lines[0]?.msg, 'job failed');
  const again = await job.run();
  assert.equal(again.error, undefined, 'the next run takes the lock again');
  assert.equal(batches, 5);
});

test('release-reservations and a reservation for several inboxes, both waiting for one inbox row, do not deadlock', async () => {
  // Eight inboxes, each with a reservation old enough to release. A session holds the first row (as a
  // delivery does for a moment); a new reservation for all eight waits for it, and so does the job.
  // Each must lock the rows in key order: the job once locked them in hash order, and then held a later
  // row the reservation needed while it waited for the first (PostgreSQL: deadlock detected, after
  // deadlock_timeout; in 7 of 8 runs with random inbox ids, the first row not being first in hash order).
  const inboxes = [];
  for (let i = 0; i < 8; i++) inboxes.push(await h.provision());
  const ids = inboxes.map((inbox) => inbox.inbox_id).sort();
  const reservedAt = h.clock.now();
  for (const [i, inboxId] of ids.entries()) {
    const reservation = { inboxId, messageId: newMessageId(), queueId: `OLD${i}`, sizeBytes: 100 };
    assert.equal(
      await h.messages.reserve({ ...reservation, envelopeFrom: 'old@example.com', now: reservedAt }),
      'reserved',
    );
  }
  h.clock.advance(h.config.reservationTtlSeconds + 1);

  const holder = new pg.Client({ connectionString: h.database.url });
  await holder.connect();
  const reservations = ids.map((inboxId) => ({
    inboxId,
    messageId: newMessageId(),
    queueId: 'NEW1',
    sizeBytes: 100,
    envelopeFrom: 'new@example.com',
    now: h.clock.now(),
  }));
  let reserving: ReturnType<typeof h.messages.reserveAll> | undefined;
  let releasing: Promise<JobReport> | undefined;
  try {
    await holder.query('BEGIN');
    await holder.query('SELECT 1 FROM inboxes WHERE inbox_id = $1 FOR UPDATE', [ids[0]]);
    reserving = h.messages.reserveAll(reservations);
    await untilWaiting(h.database.url, 1);
    releasing = testJobs(h).run('release-reservations');
    await untilWaiting(h.database.url, 2);
    await holder.query('COMMIT');
  } finally {
    // Ends the hold in every case: an open transaction would keep both waiting for good.
    await holder.end();
  }
  assert.deepEqual(await reserving, { kind: 'reserved' });
  const report = await (releasing as Promise<JobReport>);
  assert.deepEqual(report.counts, { reservations: 8, bytes: 800, inboxes: 8 });
  assert.equal(
    await scalar(h, `SELECT count(*) FROM messages WHERE queue_id = 'NEW1' AND state = 'in_flight'`),
    8,
  );
});
