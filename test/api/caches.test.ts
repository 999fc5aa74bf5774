/**
 * What one API process keeps (poll pages, core/poll-cache.ts; usage, core/usage-cache.ts) is never
 * served stale: writes made elsewhere on the same database, and time rules, both end it.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { TOKENS } from '../../src/container.ts';
import { newMessageId } from '../../src/core/ids.ts';
import { hashCredential } from '../../src/core/secrets.ts';
import { ADMIT_SQL } from '../../src/storage/admit-sql.ts';
import type { Database } from '../../src/storage/database.ts';
import { startApiProcess } from '../support/api-process.ts';
import { type ApiClient, type Harness, startHarness } from '../support/harness.ts';

let h: Harness;
let other: ApiClient;
let closeOther: () => Promise<void>;

before(async () => {
  h = await startHarness({ POLL_RATE_BURST: '10000', DOWNLOAD_RATE_BURST: '10000' });
  // A second API process on the same database: its own container, so its own cache and pool.
  const process = await startApiProcess(h, { poolSize: 4 });
  other = process.api;
  closeOther = process.close;
});
after(async () => {
  await closeOther();
  await h.close();
});

const pollPath = (id: string) => `/v1/inboxes/${id}/messages`;

test('a download through another process shows in the next poll of this one', async () => {
  const inbox = await h.provision();
  const token = inbox.credentials.reader;
  await h.deliver(inbox.inbox_id, 'Subject: one\r\n\r\nbody\r\n');
  const first = await h.api.get(pollPath(inbox.inbox_id), { token });
  const again = await h.api.get(pollPath(inbox.inbox_id), { token });
  assert.deepEqual(again.json.messages, first.json.messages);
  assert.equal(again.json.messages[0].downloaded_at, null);

  h.clock.advance(10);
  const url = new URL(first.json.messages[0].url);
  const download = await other.get(url.pathname, { token });
  assert.equal(download.status, 200);

  const after = await h.api.get(pollPath(inbox.inbox_id), { token });
  assert.equal(after.json.messages[0].downloaded_at, h.clock.now().toISOString());
  assert.equal(
    after.json.messages[0].delete_after,
    new Date(h.clock.now().getTime() + h.config.downloadGraceSeconds * 1000).toISOString(),
  );
});

test('a message stored and a rejection recorded after a poll are listed by the next poll of the same process', async () => {
  const inbox = await h.provision();
  const token = inbox.credentials.owner;
  await h.deliver(inbox.inbox_id, 'Subject: one\r\n\r\n1\r\n');
  await h.api.get(pollPath(inbox.inbox_id), { token });
  await h.api.get(pollPath(inbox.inbox_id), { token });
  await h.deliver(inbox.inbox_id, 'Subject: two\r\n\r\n2\r\n', { summary: { subject: 'two' } });
  await h.reject(inbox.inbox_id, { reason: 'quota', sizeBytes: 123 });
  const poll = await h.api.get(pollPath(inbox.inbox_id), { token });
  assert.equal(poll.json.messages.length, 2);
  assert.equal(poll.json.messages[1].subject, 'two');
  assert.equal(poll.json.rejections.length, 1);
  assert.equal(poll.json.inbox.message_count, 2);
});

test('a kept page ends when its first message passes delete_after, with no write at all', async () => {
  const inbox = await h.provision();
  const token = inbox.credentials.owner;
  await h.api.post(`/v1/inboxes/${inbox.inbox_id}/extend`, { token });
  await h.deliver(inbox.inbox_id, 'Subject: one\r\n\r\n1\r\n');
  await h.api.get(pollPath(inbox.inbox_id), { token });
  h.clock.advance(60);
  await h.deliver(inbox.inbox_id, 'Subject: two\r\n\r\n2\r\n', { summary: { subject: 'two' } });
  await h.api.get(pollPath(inbox.inbox_id), { token });
  const kept = await h.api.get(pollPath(inbox.inbox_id), { token });
  assert.equal(kept.json.messages.length, 2);
  h.clock.advance(h.config.unclaimedSeconds - 30);
  const after = await h.api.get(pollPath(inbox.inbox_id), { token });
  assert.deepEqual(
    after.json.messages.map((m: { subject: string }) => m.subject),
    ['two'],
  );
  assert.equal(after.json.inbox.message_count, 1);
});

test('a kept page ends at the inbox expiry: the next poll answers expired with no messages', async () => {
  const inbox = await h.provision();
  const token = inbox.credentials.reader;
  await h.deliver(inbox.inbox_id, 'Subject: one\r\n\r\n1\r\n');
  await h.api.get(pollPath(inbox.inbox_id), { token });
  await h.api.get(pollPath(inbox.inbox_id), { token });
  h.clock.advance(h.config.unitSeconds);
  const expired = await h.api.get(pollPath(inbox.inbox_id), { token });
  assert.equal(expired.json.inbox.state, 'expired');
  assert.deepEqual(expired.json.messages, []);
});

test('a reservation made after a status shows in the next status: counts include deliveries in flight', async () => {
  const inbox = await h.provision();
  const token = inbox.credentials.reader;
  await h.deliver(inbox.inbox_id, 'Subject: one\r\n\r\n1\r\n');
  const before = await h.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token });
  await h.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token });
  await h.messages.reserve({
    inboxId: inbox.inbox_id,
    messageId: newMessageId(),
    queueId: 'CACHEQ1',
    sizeBytes: 5000,
    envelopeFrom: 'a@example.com',
    now: h.clock.now(),
  });
  const after = await h.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token });
  assert.equal(after.json.message_count, before.json.message_count + 1);
  assert.equal(after.json.quota_used_bytes, before.json.quota_used_bytes + 5000);
});

test('usage kept by one process drops when a message downloaded through another passes its grace', async () => {
  const inbox = await h.provision();
  const token = inbox.credentials.reader;
  await h.deliver(inbox.inbox_id, 'Subject: one\r\n\r\n1\r\n');
  const poll = await h.api.get(pollPath(inbox.inbox_id), { token });
  const held = await h.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token });
  assert.equal(held.json.message_count, 1);
  await other.get(new URL(poll.json.messages[0].url).pathname, { token });
  h.clock.advance(h.config.downloadGraceSeconds);
  const gone = await h.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token });
  assert.equal(gone.json.message_count, 0);
  assert.equal(gone.json.quota_used_bytes, 0);
});

test('usage the process already holds for the inbox version costs no scan of its messages', async () => {
  const inbox = await h.provision();
  await h.deliver(inbox.inbox_id, 'Subject: one\r\n\r\nbody\r\n');
  const db = h.container.resolve<Database>(TOKENS.Database);
  const [{ version }] = (
    await db.pool.query('SELECT version FROM inboxes WHERE inbox_id = $1', [inbox.inbox_id])
  ).rows as [{ version: number }];
  const now = h.clock.now();
  const explain = (knownVersion: number | null) =>
    db.withClient(async (client) => {
      await client.query(`PREPARE admit_probe AS ${ADMIT_SQL}`);
      try {
        // EXECUTE takes no bind parameters: the values go in as literals.
        const hash = hashCredential(inbox.credentials.reader).toString('hex');
        const result = await client.query(
          `EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) EXECUTE admit_probe('\\x${hash}', 'poll',
            '${inbox.inbox_id}', false, '${now.toISOString()}', '${now.toISOString()}', 0.001, 1, true, ${knownVersion})`,
        );
        const plan = result.rows.map((r: Record<string, string>) => String(r['QUERY PLAN']));
        return plan.find((line) => / on messages\b/.test(line)) ?? '';
      } finally {
        await client.query('DEALLOCATE admit_probe');
      }
    });
  assert.match(await explain(version), /never executed/);
  assert.doesNotMatch(await explain(version - 1), /never executed/);
  assert.doesNotMatch(await explain(null), /never executed/);
});

test('an extend through another process ends a page kept while the inbox looked expired: its messages are listed again', async () => {
  // A process whose clock is 2 s ahead sees the inbox expired a moment before it really is.
  const ahead = { now: () => new Date(h.clock.now().getTime() + 2_000) };
  const other = await startApiProcess(h, { clock: ahead });
  try {
    const fast = other.api;
    const inbox = await h.provision();
    const token = inbox.credentials.reader;
    await h.deliver(inbox.inbox_id, 'Subject: one\r\n\r\n1\r\n');
    h.clock.advance(h.config.unitSeconds - 1);
    const early = await fast.get(pollPath(inbox.inbox_id), { token });
    assert.equal(early.json.inbox.state, 'expired');
    assert.deepEqual(early.json.messages, []);

    const extended = await h.api.post(`/v1/inboxes/${inbox.inbox_id}/extend`, {
      token: inbox.credentials.owner,
    });
    assert.equal(extended.status, 200, extended.text);
    const after = await fast.get(pollPath(inbox.inbox_id), { token });
    assert.equal(after.json.inbox.state, 'live');
    assert.equal(after.json.messages.length, 1, 'the message is listed again');
  } finally {
    await other.close();
  }
});
