/**
 * expire-inboxes (contract section 3, `live` -> `expired`): every message of an expired inbox is deleted
 * with reason `expired` and its content freed, the status keeps its final counts, other inboxes are not
 * touched; the job logs its counts, works in bounded batches, and a second run does nothing.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import pg from 'pg';
import { newMessageId } from '../../src/core/ids.ts';
import type { ProvisionedInbox } from '../../src/core/inbox-service.ts';
import { EXPIRE_SETTLE_SECONDS } from '../../src/jobs/expire-inboxes.ts';
import { expectError } from '../support/assertions.ts';
import { FakeClock } from '../support/clock.ts';
import { type ApiResponse, type Harness, startHarness } from '../support/harness.ts';
import { footprint, scalar, testJobs } from '../support/jobs.ts';
import { untilWaiting } from '../support/lock-waits.ts';

let h: Harness;
before(async () => {
  h = await startHarness({ POLL_RATE_BURST: '100000', DOWNLOAD_RATE_BURST: '100000' });
});
after(() => h.close());

const status = async (inbox: ProvisionedInbox) =>
  (await h.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.reader })).json;
const poll = async (inbox: ProvisionedInbox) =>
  (await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, { token: inbox.credentials.reader })).json;
const download = (inbox: ProvisionedInbox, id: string) =>
  h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages/${id}`, { token: inbox.credentials.reader });

function advanceTo(isoTime: string, seconds = 0): void {
  const target = Date.parse(isoTime) + seconds * 1000;
  h.clock.advance((target - h.clock.now().getTime()) / 1000);
}

test('at expires_at every message is deleted with reason expired, its content freed, and the status keeps its final counts', async () => {
  const jobs = testJobs(h);
  const inbox = await h.provision();
  const other = await h.provision();
  for (let i = 0; i < 2; i++) {
    await h.api.post(`/v1/inboxes/${other.inbox_id}/extend`, { token: other.credentials.owner });
  }
  const a = 'Subject: a\r\n\r\naaaa\r\n';
  const b = 'Subject: b\r\n\r\nbbbbbbbb\r\n';
  const c = 'Subject: c\r\n\r\ncc\r\n';
  const aId = await h.deliver(inbox.inbox_id, a);
  const bId = await h.deliver(inbox.inbox_id, b);
  const cId = await h.deliver(inbox.inbox_id, c);
  const kept = await h.deliver(other.inbox_id, 'Subject: other\r\n\r\nstays\r\n');
  // A delivery still in flight at expiry counts too ("including deliveries in flight").
  await h.messages.reserve({
    inboxId: inbox.inbox_id,
    messageId: newMessageId(),
    queueId: 'INFLIGHT1',
    sizeBytes: 500,
    envelopeFrom: 'late@example.com',
    now: h.clock.now(),
  });
  // a is downloaded early (deleted before expiry), c shortly before expiry (still held then).
  advanceTo(inbox.expires_at, -h.config.downloadGraceSeconds - 100);
  assert.equal((await download(inbox, aId)).status, 200);
  advanceTo(inbox.expires_at, -10);
  assert.equal((await download(inbox, cId)).status, 200);
  await jobs.sweep();
  const final = await status(inbox);
  assert.equal(final.message_count, 3);
  assert.equal(final.quota_used_bytes, b.length + c.length + 500);

  advanceTo(inbox.expires_at, EXPIRE_SETTLE_SECONDS);
  const expired = await status(inbox);
  assert.equal(expired.state, 'expired');
  assert.equal(expired.message_count, final.message_count);
  assert.equal(expired.quota_used_bytes, final.quota_used_bytes);

  h.clock.advance(1);
  const report = await jobs.run('expire-inboxes');
  assert.equal(report.ran, true);
  assert.equal(report.counts.messages, 3, 'b, c and the reservation (a went at its delete_after)');
  assert.deepEqual(await status(inbox), expired, 'the final counts hold after the job');
  const held = await footprint(h, inbox.inbox_id);
  assert.equal(held.undeleted, 0);
  assert.equal(held.chunks, 0, 'storage returns to zero');
  assert.equal(held.messages, 4, 'the rows stay as tombstones until the purge');
  assert.deepEqual((await poll(inbox)).messages, []);
  for (const id of [bId, cId]) {
    const gone = await download(inbox, id);
    assert.equal(gone.status, 410);
    assert.deepEqual(gone.json.error.details, { reason: 'expired' });
  }
  const reasons = await scalar(
    h,
    "SELECT count(*) FROM messages WHERE inbox_id = $1 AND deleted_reason = 'expired' AND deleted_at > $2",
    [inbox.inbox_id, inbox.expires_at],
  );
  assert.equal(reasons, 3);

  // Later sweeps (delete-messages passes c's delete_after, after expiry) leave the final counts alone.
  h.clock.advance(h.config.downloadGraceSeconds);
  await jobs.sweep();
  assert.deepEqual(await status(inbox), expired);
  h.clock.advance(h.config.purgeAfterSeconds - h.config.downloadGraceSeconds - EXPIRE_SETTLE_SECONDS - 2);
  await jobs.sweep();
  assert.deepEqual(await status(inbox), expired);

  // The live inbox was not touched.
  const live = await download(other, kept);
  assert.equal(live.status, 200);
  assert.equal((await footprint(h, other.inbox_id)).chunks, 1);
  // Leaves no mail for the later tests' runs to count when the clock passes this inbox's expiry.
  await h.inboxes.cancel(other.inbox_id, h.clock.now());
});

test('expire-inboxes logs one line per run with its counts, and a second run does nothing', async () => {
  const jobs = testJobs(h);
  const inbox = await h.provision();
  for (let i = 0; i < 3; i++) await h.deliver(inbox.inbox_id, `Subject: ${i}\r\n\r\n0123456789\r\n`);
  advanceTo(inbox.expires_at, EXPIRE_SETTLE_SECONDS + 1);
  const first = await jobs.run('expire-inboxes');
  assert.equal(first.counts.messages, 3);
  const [line] = jobs.lines;
  assert.equal(jobs.lines.length, 1);
  assert.equal(line?.msg, 'job ran');
  assert.equal(line?.job, 'expire-inboxes');
  assert.equal(line?.messages, 3);
  assert.equal(typeof line?.bytes, 'number');
  assert.equal(line?.complete, true);
  assert.equal(typeof line?.duration_ms, 'number');
  assert.equal(line?.batches, 2, 'one batch of three, then one that finds nothing');

  const again = await jobs.run('expire-inboxes');
  assert.deepEqual(again.counts, { messages: 0, bytes: 0 });
  assert.equal(again.complete, true);
});

test('expire-inboxes deletes in batches of SWEEP_BATCH_SIZE and stops at its cap; the next run carries on', async () => {
  const inbox = await h.provision();
  for (let i = 0; i < 25; i++) await h.deliver(inbox.inbox_id, `Subject: ${i}\r\n\r\nbody ${i}\r\n`);
  advanceTo(inbox.expires_at, EXPIRE_SETTLE_SECONDS + 1);

  const capped = testJobs(h, { batchRows: 10, maxBatches: 2 });
  const first = await capped.run('expire-inboxes');
  assert.equal(first.counts.messages, 20);
  assert.equal(first.batches, 2);
  assert.equal(first.complete, false);
  assert.equal(capped.lines[0]?.complete, false);
  assert.equal((await footprint(h, inbox.inbox_id)).undeleted, 5);

  const second = await capped.run('expire-inboxes');
  assert.equal(second.counts.messages, 5);
  assert.equal(second.complete, true);
  assert.equal((await footprint(h, inbox.inbox_id)).chunks, 0);
});

test('expire-inboxes frees at most its byte bound of content per statement, but always one message', async () => {
  const inbox = await h.provision();
  const big = Buffer.alloc(300 * 1024, 0x61);
  for (let i = 0; i < 3; i++) await h.deliver(inbox.inbox_id, big);
  advanceTo(inbox.expires_at, EXPIRE_SETTLE_SECONDS + 1);
  const jobs = testJobs(h, { batchRows: 100, batchBytes: 400 * 1024 });
  const report = await jobs.run('expire-inboxes');
  assert.equal(report.counts.messages, 3);
  assert.equal(report.batches, 4, 'one message per statement, then an empty one');
  assert.equal((await footprint(h, inbox.inbox_id)).chunks, 0);
});

test('a run asked to stop makes no further batch and reports itself incomplete; the next run finishes', async () => {
  const inbox = await h.provision();
  for (let i = 0; i < 3; i++) await h.deliver(inbox.inbox_id, `Subject: ${i}\r\n\r\n${i}\r\n`);
  advanceTo(inbox.expires_at, EXPIRE_SETTLE_SECONDS + 1);
  const jobs = testJobs(h);
  const stopping = new AbortController();
  stopping.abort();
  const job = jobs.jobs.find((j) => j.name === 'expire-inboxes');
  const stopped = await job?.run(stopping.signal);
  assert.equal(stopped?.batches, 0);
  assert.equal(stopped?.complete, false);
  assert.equal((await footprint(h, inbox.inbox_id)).undeleted, 3);
  const next = await jobs.run('expire-inboxes');
  assert.equal(next.complete, true);
  assert.equal(next.counts.messages, 3);
});

/** Holds the inbox row (as a delivery or another batch would) while `during` runs; then lets go. */
async function holdingInbox(inboxId: string, during: () => Promise<void>): Promise<void> {
  const holder = new pg.Client({ connectionString: h.database.url });
  await holder.connect();
  try {
    await holder.query('BEGIN');
    await holder.query('SELECT 1 FROM inboxes WHERE inbox_id = $1 FOR UPDATE', [inboxId]);
    await during();
    await holder.query('COMMIT');
  } finally {
    await holder.end();
  }
}

test('an extend that waited while the expiry passed answers 409 and the mail goes; one within the settle time keeps its mail', async () => {
  const extend = (inbox: ProvisionedInbox) =>
    h.api.post(`/v1/inboxes/${inbox.inbox_id}/extend`, { token: inbox.credentials.owner });

  // The extend is admitted 1 s before expiry and waits for the row; when it gets it, the expiry and the
  // settle time have passed: it must answer by its time then, not by the time it was admitted, or the
  // sweep that runs next would free the mail of an inbox the extend had just kept live.
  const late = await h.provision();
  await h.deliver(late.inbox_id, 'Subject: late\r\n\r\nlate\r\n');
  advanceTo(late.expires_at, -1);
  let lateAnswer: Promise<ApiResponse> | undefined;
  await holdingInbox(late.inbox_id, async () => {
    lateAnswer = extend(late);
    await untilWaiting(h.database.url);
    advanceTo(late.expires_at, EXPIRE_SETTLE_SECONDS + 1);
  });
  const swept = await testJobs(h).run('expire-inboxes');
  assert.equal(swept.counts.messages, 1);
  expectError(await (lateAnswer as Promise<ApiResponse>), 409, 'inbox_expired');
  assert.equal((await status(late)).state, 'expired');

  // The job host's clock 2 s past expiry, the API host's 1 s before it: the extend wins, the mail stays.
  const kept = await h.provision();
  const keptId = await h.deliver(kept.inbox_id, 'Subject: kept\r\n\r\nkept\r\n');
  advanceTo(kept.expires_at, -1);
  const jobHost = new FakeClock(new Date(Date.parse(kept.expires_at) + 2000));
  assert.equal((await testJobs({ ...h, clock: jobHost }).run('expire-inboxes')).counts.messages, 0);
  const extended = await extend(kept);
  assert.equal(extended.status, 200, extended.text);
  advanceTo(kept.expires_at, 10);
  assert.equal((await status(kept)).state, 'live');
  assert.equal((await download(kept, keptId)).status, 200);
});

test('a store finishing after expiry uses the same settle time as this job (one number in two places)', async () => {
  // The store functions of migration 20261203000000 answer `expired` (and store nothing) for a delivery
  // finishing EXPIRE_SETTLE_SECONDS past expires_at; the job frees an inbox's messages from the same
  // moment. Changing one without the other would store mail the job has already passed by.
  const settle = `%interval '${EXPIRE_SETTLE_SECONDS} seconds'%`;
  const count = (where: string) =>
    scalar(h, `SELECT count(*) FROM pg_proc WHERE proname = 'finish_delivery_outcome' ${where}`, [settle]);
  assert.equal(await count('AND $1::text IS NOT NULL'), 1);
  assert.equal(await count('AND prosrc LIKE $1'), 1);
});
