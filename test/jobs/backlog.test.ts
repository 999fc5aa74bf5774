/**
 * A backlog of 10,000 expired messages (100 inboxes of 100) is swept in bounded batches while mail keeps
 * arriving for a live inbox: the sweep's time is measured and printed, every batch is one short
 * transaction, and each delivery made during the sweep completes promptly.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import type { ProvisionedInbox } from '../../src/core/inbox-service.ts';
import { EXPIRE_SETTLE_SECONDS } from '../../src/jobs/expire-inboxes.ts';
import type { JobReport } from '../../src/jobs/job.ts';
import { type Harness, startHarness } from '../support/harness.ts';
import { deliverMany, footprint, scalar, testJobs } from '../support/jobs.ts';

const INBOXES = 100;
const MESSAGES = 10_000;
const BATCH = 500;
/** A delivery (reserve, then store) during the sweep must take no longer than this. */
const PROMPT_MS = 1000;

let h: Harness;
let expired: ProvisionedInbox[];
let live: ProvisionedInbox;
before(async () => {
  h = await startHarness({ SWEEP_BATCH_SIZE: String(BATCH) });
  expired = [];
  for (let i = 0; i < INBOXES; i++) expired.push(await h.provision());
  live = await h.provision();
  for (let i = 0; i < 3; i++)
    await h.api.post(`/v1/inboxes/${live.inbox_id}/extend`, { token: live.credentials.owner });
  const started = Date.now();
  const body = `Subject: backlog\r\n\r\n${'x'.repeat(1000)}\r\n`;
  await deliverMany(
    h,
    expired.map((i) => i.inbox_id),
    MESSAGES,
    () => body,
  );
  process.stdout.write(`# backlog of ${MESSAGES} messages stored in ${Date.now() - started} ms\n`);
});
after(() => h.close());

/** Runs `job` while delivering to the live inbox one message after another; the latency of each. */
async function whileDelivering(
  job: () => Promise<JobReport>,
): Promise<{ report: JobReport; latencies: number[] }> {
  const latencies: number[] = [];
  let done = false;
  const delivering = (async () => {
    while (!done) {
      const started = performance.now();
      await h.deliver(live.inbox_id, `Subject: during\r\n\r\n${latencies.length}\r\n`);
      latencies.push(performance.now() - started);
    }
  })();
  const report = await job().finally(() => {
    done = true;
  });
  await delivering;
  return { report, latencies };
}

const summary = (latencies: number[]) =>
  `${latencies.length} deliveries meanwhile, slowest ${Math.max(...latencies).toFixed(1)} ms`;

test('10,000 expired messages are swept in bounded batches without holding up deliveries', async () => {
  const jobs = testJobs(h);
  const before = await scalar(h, 'SELECT count(*) FROM message_chunks');
  assert.ok(before >= MESSAGES);
  h.clock.advance(h.config.unitSeconds + EXPIRE_SETTLE_SECONDS + 1);

  const expiry = await whileDelivering(() => jobs.run('expire-inboxes'));
  process.stdout.write(
    `# expire-inboxes: ${expiry.report.counts.messages} messages freed in ${expiry.report.durationMs} ms, ` +
      `${expiry.report.batches} batches of at most ${BATCH}; ${summary(expiry.latencies)}\n`,
  );
  assert.equal(expiry.report.counts.messages, MESSAGES);
  assert.equal(expiry.report.batches, MESSAGES / BATCH + 1, 'batches of SWEEP_BATCH_SIZE, then an empty one');
  assert.equal(expiry.report.complete, true);
  assert.ok(expiry.latencies.length > 0, 'deliveries went on during the sweep');
  assert.ok(Math.max(...expiry.latencies) < PROMPT_MS, summary(expiry.latencies));
  for (const inbox of expired.slice(0, 5)) assert.equal((await footprint(h, inbox.inbox_id)).chunks, 0);
  assert.equal(
    await scalar(h, "SELECT count(*) FROM messages WHERE state <> 'deleted' AND inbox_id <> $1", [
      live.inbox_id,
    ]),
    0,
  );

  h.clock.advance(h.config.purgeAfterSeconds);
  const purge = await whileDelivering(() => jobs.run('purge-inboxes'));
  process.stdout.write(
    `# purge-inboxes: ${purge.report.counts.inboxes} inboxes, ${purge.report.counts.messages} tombstones in ` +
      `${purge.report.durationMs} ms, ${purge.report.batches} batches; ${summary(purge.latencies)}\n`,
  );
  assert.equal(purge.report.counts.inboxes, INBOXES);
  assert.equal(purge.report.counts.messages, MESSAGES);
  assert.ok(Math.max(...purge.latencies) < PROMPT_MS, summary(purge.latencies));
  assert.equal(await scalar(h, 'SELECT count(*) FROM messages WHERE inbox_id <> $1', [live.inbox_id]), 0);
  const status = await h.api.get(`/v1/inboxes/${live.inbox_id}`, { token: live.credentials.reader });
  assert.equal(status.json.message_count, expiry.latencies.length + purge.latencies.length);
});
