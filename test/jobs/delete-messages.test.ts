/**
 * delete-messages (contract section 3, message rows `downloaded` and `unclaimed`, and `lost`): a message
 * past its delete_after is deleted with the reason its timer gives and its content freed; one not yet
 * due stays; a stored copy found incomplete is deleted as `lost` and logged.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { TOKENS } from '../../src/container.ts';
import type { ProvisionedInbox } from '../../src/core/inbox-service.ts';
import type { Database } from '../../src/storage/database.ts';
import { type Harness, startHarness } from '../support/harness.ts';
import { footprint, scalar, testJobs } from '../support/jobs.ts';

let h: Harness;
before(async () => {
  h = await startHarness({ POLL_RATE_BURST: '100000', DOWNLOAD_RATE_BURST: '100000' });
});
after(() => h.close());

const poll = async (inbox: ProvisionedInbox) =>
  (await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, { token: inbox.credentials.reader })).json;
const download = (inbox: ProvisionedInbox, id: string) =>
  h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages/${id}`, { token: inbox.credentials.reader });
const reasonOf = (inboxId: string, id: string) =>
  h.container
    .resolve<Database>(TOKENS.Database)
    .pool.query(
      'SELECT state, deleted_reason, deleted_at FROM messages WHERE inbox_id = $1 AND message_id = $2',
      [inboxId, id],
    )
    .then((r) => r.rows[0]);

test('a downloaded message goes DOWNLOAD_GRACE_SECONDS after its download and a listed one UNCLAIMED_SECONDS after its listing, each with its reason; others stay', async () => {
  const jobs = testJobs(h);
  const inbox = await h.provision();
  await h.api.post(`/v1/inboxes/${inbox.inbox_id}/extend`, { token: inbox.credentials.owner });
  const fetched = await h.deliver(inbox.inbox_id, 'Subject: fetched\r\n\r\nfetched\r\n');
  const ignored = await h.deliver(inbox.inbox_id, 'Subject: ignored\r\n\r\nignored\r\n');
  await poll(inbox);
  const unlisted = await h.deliver(inbox.inbox_id, 'Subject: unlisted\r\n\r\nnot polled yet\r\n');
  assert.equal((await download(inbox, fetched)).status, 200);

  h.clock.advance(h.config.downloadGraceSeconds - 1);
  assert.deepEqual((await jobs.run('delete-messages')).counts, {
    downloaded: 0,
    unclaimed: 0,
    bytes: 0,
    checked: 3,
    lost: 0,
  });
  h.clock.advance(1);
  const first = await jobs.run('delete-messages');
  assert.equal(first.counts.downloaded, 1);
  assert.equal(first.counts.unclaimed, 0);
  const row = await reasonOf(inbox.inbox_id, fetched);
  assert.equal(row.state, 'deleted');
  assert.equal(row.deleted_reason, 'downloaded');
  assert.deepEqual((await download(inbox, fetched)).json.error.details, { reason: 'downloaded' });

  h.clock.advance(h.config.unclaimedSeconds - h.config.downloadGraceSeconds);
  const second = await jobs.run('delete-messages');
  assert.equal(second.counts.unclaimed, 1);
  assert.equal((await reasonOf(inbox.inbox_id, ignored)).deleted_reason, 'unclaimed');
  assert.deepEqual((await download(inbox, ignored)).json.error.details, { reason: 'unclaimed' });
  assert.equal((await reasonOf(inbox.inbox_id, unlisted)).state, 'stored', 'never listed: no timer');
  const held = await footprint(h, inbox.inbox_id);
  assert.equal(held.chunks, 1, 'only the unlisted message keeps content');

  const again = await jobs.run('delete-messages');
  assert.equal(
    (again.counts.downloaded ?? 0) + (again.counts.unclaimed ?? 0),
    0,
    'a second run does nothing',
  );
  assert.equal(jobs.lines.filter((l) => l.msg === 'job ran').length, 4, 'one line per run');
});

test('space is really freed: after a 20 MiB message is deleted its chunks are gone', async () => {
  const jobs = testJobs(h);
  const inbox = await h.provision();
  const raw = Buffer.alloc(20 * 1024 * 1024, 0x78);
  raw.write('Subject: big\r\n\r\n');
  const id = await h.deliver(inbox.inbox_id, raw, { pieceBytes: 1024 * 1024 });
  const before = await footprint(h, inbox.inbox_id);
  assert.equal(before.chunkBytes, raw.length);
  assert.equal(before.chunks, 80);
  await poll(inbox);
  const fetched = await download(inbox, id);
  assert.equal(fetched.bytes.length, raw.length);

  h.clock.advance(h.config.downloadGraceSeconds);
  const report = await jobs.run('delete-messages');
  assert.equal(report.counts.downloaded, 1);
  assert.equal(report.counts.bytes, raw.length);
  const afterwards = await footprint(h, inbox.inbox_id);
  assert.equal(afterwards.chunks, 0);
  assert.equal(afterwards.chunkBytes, 0);
  const status = await h.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.reader });
  assert.equal(status.json.quota_used_bytes, 0);
});

test('a stored copy found incomplete is deleted with reason lost, logged, and no longer listed', async () => {
  const jobs = testJobs(h);
  const inbox = await h.provision();
  const raw = Buffer.alloc(600 * 1024, 0x79);
  const id = await h.deliver(inbox.inbox_id, raw);
  const whole = await h.deliver(inbox.inbox_id, 'Subject: whole\r\n\r\nintact\r\n');
  const before = await poll(inbox);
  assert.equal(before.messages.length, 2);
  const version = await scalar(h, 'SELECT version FROM inboxes WHERE inbox_id = $1', [inbox.inbox_id]);
  // Should not happen (contract section 3): a chunk vanishes behind the service's back.
  await scalar(h, 'DELETE FROM message_chunks WHERE inbox_id = $1 AND message_id = $2 AND seq = 1', [
    inbox.inbox_id,
    id,
  ]);

  const report = await jobs.run('delete-messages');
  assert.equal(report.counts.lost, 1);
  const logged = jobs.lines.find((l) => l.msg === 'stored copy missing; message deleted as lost');
  assert.equal(logged?.level, 'error');
  assert.equal(logged?.inbox_id, inbox.inbox_id);
  assert.equal(logged?.message_id, id);
  assert.equal(logged?.size_bytes, raw.length);
  assert.equal((await reasonOf(inbox.inbox_id, id)).deleted_reason, 'lost');
  assert.ok(
    (await scalar(h, 'SELECT version FROM inboxes WHERE inbox_id = $1', [inbox.inbox_id])) > version,
    'what a poll lists changed: the version moved',
  );
  const afterwards = await poll(inbox);
  assert.deepEqual(
    afterwards.messages.map((m: { message_id: string }) => m.message_id),
    [whole],
  );
  assert.equal(afterwards.inbox.message_count, 1);
  assert.deepEqual((await download(inbox, id)).json.error.details, { reason: 'lost' });
  assert.equal((await download(inbox, whole)).status, 200);
  assert.equal((await footprint(h, inbox.inbox_id)).chunks, 1, 'what was left of the lost copy is freed');
});

test('the lost-copy check reads a bounded number of pages per run and goes round the table', async () => {
  const inbox = await h.provision();
  for (let i = 0; i < 7; i++) await h.deliver(inbox.inbox_id, `Subject: ${i}\r\n\r\n${i}\r\n`);
  const stored = await scalar(h, "SELECT count(*) FROM messages WHERE state = 'stored'");
  const jobs = testJobs(h, { batchRows: 2, scanPages: 2 });
  const seen: number[] = [];
  for (let run = 0; run < Math.ceil(stored / 4) + 1; run++) {
    seen.push((await jobs.run('delete-messages')).counts.checked ?? 0);
  }
  assert.ok(
    seen.every((n) => n <= 4),
    `at most two pages of two per run: ${seen}`,
  );
  assert.ok(seen.reduce((a, b) => a + b, 0) >= stored, `every stored message checked once: ${seen}`);
});
