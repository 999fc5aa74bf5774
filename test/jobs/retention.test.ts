/**
 * The retention jobs, each on its own: drop-tombstones (GONE_SECONDS after deletion the id answers 404
 * and the row goes), drop-rejections (REJECTION_RETENTION_SECONDS after first listing),
 * forget-idempotency (IDEMPOTENCY_TTL_SECONDS: the same key then provisions a new inbox),
 * release-reservations (RESERVATION_TTL_SECONDS: the quota comes back) and drop-rate-buckets.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { newMessageId } from '../../src/core/ids.ts';
import type { ProvisionedInbox } from '../../src/core/inbox-service.ts';
import { EXPIRE_SETTLE_SECONDS } from '../../src/jobs/expire-inboxes.ts';
import { type Harness, startHarness } from '../support/harness.ts';
import { footprint, scalar, testJobs } from '../support/jobs.ts';

let h: Harness;
before(async () => {
  h = await startHarness({
    POLL_RATE_BURST: '100000',
    DOWNLOAD_RATE_BURST: '100000',
    QUOTA_BYTES: '10000',
    RESERVATION_TTL_SECONDS: '600',
  });
});
after(() => h.close());

const poll = async (inbox: ProvisionedInbox) =>
  (await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, { token: inbox.credentials.reader })).json;
const status = async (inbox: ProvisionedInbox) =>
  (await h.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.reader })).json;
const download = (inbox: ProvisionedInbox, id: string) =>
  h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages/${id}`, { token: inbox.credentials.reader });

/** A live inbox that outlives the clock moves of this file's tests (several hours). */
async function longLived(): Promise<ProvisionedInbox> {
  const inbox = await h.provision();
  for (let i = 0; i < 30; i++) {
    await h.api.post(`/v1/inboxes/${inbox.inbox_id}/extend`, { token: inbox.credentials.owner });
  }
  return inbox;
}

test('GONE_SECONDS after its deletion a message row goes and its id answers 404; rows deleted later stay', async () => {
  const jobs = testJobs(h);
  const inbox = await longLived();
  const early = await h.deliver(inbox.inbox_id, 'Subject: early\r\n\r\nearly\r\n');
  await poll(inbox);
  assert.equal((await download(inbox, early)).status, 200);
  h.clock.advance(60);
  const late = await h.deliver(inbox.inbox_id, 'Subject: late\r\n\r\nlate\r\n');
  await poll(inbox);
  assert.equal((await download(inbox, late)).status, 200);
  h.clock.advance(h.config.downloadGraceSeconds);
  await jobs.run('delete-messages');
  assert.equal((await footprint(h, inbox.inbox_id)).messages, 2, 'tombstones answer 410 for now');

  h.clock.advance(h.config.goneSeconds - 60);
  assert.equal((await download(inbox, early)).status, 404, 'by the time rule, before any job');
  const report = await jobs.run('drop-tombstones');
  assert.equal(report.counts.messages, 1);
  assert.equal((await footprint(h, inbox.inbox_id)).messages, 1);
  assert.equal((await download(inbox, early)).status, 404);
  assert.equal((await download(inbox, late)).status, 410);

  h.clock.advance(60);
  assert.equal((await jobs.run('drop-tombstones')).counts.messages, 1);
  assert.equal((await download(inbox, late)).status, 404);
  assert.equal((await jobs.run('drop-tombstones')).counts.messages, 0, 'a second run does nothing');
});

test('an expired inbox keeps its tombstones until its purge, even past GONE_SECONDS, so its final counts hold', async () => {
  const inbox = await h.provision();
  const jobs = testJobs({ ...h, config: { ...h.config, goneSeconds: 1 } });
  await h.deliver(inbox.inbox_id, 'Subject: kept\r\n\r\nkept\r\n');
  // Past the expiry's settle time, so the message is a tombstone (until 2026-11-25 this test moved the
  // clock to expires_at only: the job took nothing, and there was no tombstone to keep).
  h.clock.advance(h.config.unitSeconds + EXPIRE_SETTLE_SECONDS + 1);
  assert.equal((await jobs.run('expire-inboxes')).counts.messages, 1);
  assert.deepEqual(
    [(await footprint(h, inbox.inbox_id)).messages, (await footprint(h, inbox.inbox_id)).undeleted],
    [1, 0],
    'one tombstone',
  );
  const final = await status(inbox);
  assert.equal(final.message_count, 1);
  // Just before the purge (expires_at + PURGE_AFTER_SECONDS), far past GONE_SECONDS (1 s here).
  h.clock.advance(h.config.purgeAfterSeconds - EXPIRE_SETTLE_SECONDS - 2);
  assert.equal((await jobs.run('drop-tombstones')).counts.messages, 0);
  assert.equal((await footprint(h, inbox.inbox_id)).messages, 1);
  assert.deepEqual(await status(inbox), final);
});

test('REJECTION_RETENTION_SECONDS after poll first lists a rejection its row goes; rejection_count stays', async () => {
  const jobs = testJobs(h);
  const inbox = await longLived();
  await h.reject(inbox.inbox_id, { envelopeFrom: 'listed@example.net' });
  const listed = await poll(inbox);
  assert.equal(listed.rejections.length, 1);
  h.clock.advance(30);
  await h.reject(inbox.inbox_id, { envelopeFrom: 'unlisted@example.net' });

  h.clock.advance(h.config.rejectionRetentionSeconds - 31);
  assert.equal((await jobs.run('drop-rejections')).counts.rejections, 0);
  h.clock.advance(1);
  const report = await jobs.run('drop-rejections');
  assert.equal(report.counts.rejections, 1);
  assert.equal((await footprint(h, inbox.inbox_id)).rejections, 1, 'never listed: held');
  const after = await poll(inbox);
  assert.deepEqual(
    after.rejections.map((r: { envelope_from: string }) => r.envelope_from),
    ['unlisted@example.net'],
  );
  assert.equal(after.inbox.rejection_count, 2);
});

test('IDEMPOTENCY_TTL_SECONDS after a provision its key is forgotten and the same key provisions a new inbox', async () => {
  const jobs = testJobs(h);
  const key = 'forget-me-0001';
  const provision = () => h.api.post('/v1/inboxes', { body: {}, headers: { 'idempotency-key': key } });
  const first = await provision();
  assert.equal(first.status, 201);
  // Remembered through the whole TTL (InboxStore.findProvision: created at or after now - TTL).
  h.clock.advance(h.config.idempotencyTtlSeconds);
  assert.equal((await jobs.run('forget-idempotency')).counts.keys, 0);
  const replay = await provision();
  assert.equal(replay.headers.get('idempotent-replayed'), 'true');
  assert.equal(replay.json.inbox_id, first.json.inbox_id);

  h.clock.advance(1);
  const before = await scalar(h, 'SELECT count(*) FROM provision_idempotency');
  const report = await jobs.run('forget-idempotency');
  assert.ok(report.counts.keys && report.counts.keys >= 1);
  assert.equal(await scalar(h, 'SELECT count(*) FROM provision_idempotency'), before - report.counts.keys);
  const fresh = await provision();
  assert.equal(fresh.status, 201);
  assert.notEqual(fresh.json.inbox_id, first.json.inbox_id);
  assert.equal((await jobs.run('forget-idempotency')).counts.keys, 0, 'the new record is kept');
});

test('a reservation still in flight RESERVATION_TTL_SECONDS after it was made is released: its quota comes back', async () => {
  const jobs = testJobs(h);
  const inbox = await longLived();
  const reserve = (queueId: string, sizeBytes: number) =>
    h.messages.reserve({
      inboxId: inbox.inbox_id,
      messageId: newMessageId(),
      queueId,
      sizeBytes,
      envelopeFrom: 'sender@example.com',
      now: h.clock.now(),
    });
  assert.equal(await reserve('STUCK1', 9000), 'reserved');
  assert.equal(await reserve('NEXT1', 2000), 'over_quota');
  assert.equal((await status(inbox)).quota_used_bytes, 9000);
  const version = await scalar(h, 'SELECT version FROM inboxes WHERE inbox_id = $1', [inbox.inbox_id]);

  h.clock.advance(h.config.reservationTtlSeconds - 1);
  assert.equal((await jobs.run('release-reservations')).counts.reservations, 0);
  h.clock.advance(1);
  const report = await jobs.run('release-reservations');
  assert.deepEqual(report.counts, { reservations: 1, bytes: 9000, inboxes: 1 });
  assert.ok((await scalar(h, 'SELECT version FROM inboxes WHERE inbox_id = $1', [inbox.inbox_id])) > version);
  const after = await status(inbox);
  assert.equal(after.quota_used_bytes, 0);
  assert.equal(after.message_count, 0);
  assert.equal(await reserve('NEXT2', 2000), 'reserved');

  // Postfix delivering it after all stores nothing (the row is deleted): a duplicate, answered 250.
  const late = await h.messages.store(
    {
      inboxId: inbox.inbox_id,
      queueId: 'STUCK1',
      envelopeFrom: 'sender@example.com',
      now: h.clock.now(),
      summary: {
        fromName: null,
        fromAddress: null,
        subject: null,
        internetMessageId: null,
        authentication: null,
      },
    },
    (async function* () {
      yield Buffer.from('Subject: late\r\n\r\nlate\r\n');
    })(),
  );
  assert.equal(late.kind, 'released');
  assert.equal((await poll(inbox)).messages.length, 0);
  assert.equal((await jobs.run('release-reservations')).counts.reservations, 0, 'a second run does nothing');
});

test('rate buckets of purged inboxes are removed, those of live inboxes stay', async () => {
  const jobs = testJobs(h, { batchRows: 2 });
  const gone = await h.provision();
  const live = await longLived();
  await poll(gone);
  await h.api.head(`/v1/inboxes/${gone.inbox_id}/messages/msg_00000000000000000000`, {
    token: gone.credentials.reader,
  });
  await poll(live);
  assert.equal((await footprint(h, gone.inbox_id)).rateBuckets, 2);
  h.clock.advance(h.config.unitSeconds + h.config.purgeAfterSeconds);

  const report = await jobs.run('drop-rate-buckets');
  assert.ok((report.counts.buckets ?? 0) >= 2);
  assert.equal((await footprint(h, gone.inbox_id)).rateBuckets, 0);
  assert.equal((await footprint(h, gone.inbox_id)).inboxes, 1, 'the inbox row is purge-inboxes’ to remove');
  assert.equal((await footprint(h, live.inbox_id)).rateBuckets, 1);
  assert.equal((await jobs.run('drop-rate-buckets')).counts.buckets, 0);
});
