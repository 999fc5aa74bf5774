/**
 * Message and inbox lifecycle (contract section 3) with the fake clock. No job runs here: every rule is
 * evaluated on read (DESIGN decision 9), so poll, status and download must agree with the timers alone.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { TOKENS } from '../../src/container.ts';
import type { InboxService, ProvisionedInbox } from '../../src/core/inbox-service.ts';
import { iso, plus } from '../support/assertions.ts';
import { type ApiResponse, type Harness, startHarness } from '../support/harness.ts';

let h: Harness;
before(async () => {
  h = await startHarness({ POLL_RATE_BURST: '100000', DOWNLOAD_RATE_BURST: '100000', QUOTA_BYTES: '200000' });
});
after(() => h.close());

async function poll(inbox: ProvisionedInbox) {
  const response = await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, {
    token: inbox.credentials.reader,
  });
  assert.equal(response.status, 200, response.text);
  return response.json;
}

async function status(inbox: ProvisionedInbox) {
  const response = await h.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.reader });
  assert.equal(response.status, 200, response.text);
  return response.json;
}

const download = (inbox: ProvisionedInbox, id: string, method = 'GET'): Promise<ApiResponse> =>
  h.api.request(method, `/v1/inboxes/${inbox.inbox_id}/messages/${id}`, { token: inbox.credentials.reader });

const ids = (body: { messages: { message_id: string }[] }) => body.messages.map((m) => m.message_id);

/** Moves the fake clock to `seconds` after the given instant. */
function advanceTo(isoTime: string, seconds = 0): void {
  const target = Date.parse(isoTime) + seconds * 1000;
  const now = h.clock.now().getTime();
  assert.ok(target >= now, 'the clock only moves forward');
  h.clock.advance((target - now) / 1000);
}

test('a delivered message counts in message_count and quota_used_bytes from the moment it is reserved', async () => {
  const inbox = await h.provision();
  const raw = 'Subject: count\r\n\r\n0123456789\r\n';
  await h.deliver(inbox.inbox_id, raw);
  const s = await status(inbox);
  assert.equal(s.message_count, 1);
  assert.equal(s.quota_used_bytes, raw.length);
  assert.equal(s.state, 'live');
});

test('a stored message that is never listed has no unclaimed timer running', async () => {
  const inbox = await h.provision();
  const id = await h.deliver(inbox.inbox_id, 'Subject: quiet\r\n\r\nquiet\r\n');
  h.clock.advance(h.config.unitSeconds - 10);
  const body = await poll(inbox);
  assert.deepEqual(ids(body), [id]);
  assert.equal(body.messages[0].delete_after, plus(body.server_time, h.config.unclaimedSeconds));
});

test('a listed message never downloaded vanishes from poll and from the counts UNCLAIMED_SECONDS after first listing', async () => {
  const inbox = await h.provision();
  await h.api.post(`/v1/inboxes/${inbox.inbox_id}/extend`, { token: inbox.credentials.owner });
  const keep = 'Subject: keep\r\n\r\nkeep\r\n';
  const drop = 'Subject: drop\r\n\r\ndrop me\r\n';
  const dropped = await h.deliver(inbox.inbox_id, drop);
  const first = await poll(inbox);
  assert.deepEqual(ids(first), [dropped]);
  h.clock.advance(600);
  const kept = await h.deliver(inbox.inbox_id, keep);

  advanceTo(first.messages[0].delete_after, -1);
  const justBefore = await poll(inbox);
  assert.deepEqual(ids(justBefore), [dropped, kept]);
  assert.equal(justBefore.inbox.message_count, 2);

  h.clock.advance(1);
  const at = await poll(inbox);
  assert.deepEqual(ids(at), [kept]);
  const s = await status(inbox);
  assert.equal(s.message_count, 1);
  assert.equal(s.quota_used_bytes, keep.length);
  assert.deepEqual(at.inbox, s);
  const gone = await download(inbox, dropped);
  assert.equal(gone.status, 410);
  assert.deepEqual(gone.json.error.details, { reason: 'unclaimed' });
});

test('a downloaded message stays listed for DOWNLOAD_GRACE_SECONDS, then vanishes from poll and from the counts', async () => {
  const inbox = await h.provision();
  const raw = 'Subject: fetched\r\n\r\nfetched\r\n';
  const id = await h.deliver(inbox.inbox_id, raw);
  await poll(inbox);
  h.clock.advance(30);
  const downloadedAt = iso(h.clock.now());
  assert.equal((await download(inbox, id)).status, 200);

  h.clock.advance(h.config.downloadGraceSeconds - 1);
  const during = await poll(inbox);
  assert.deepEqual(ids(during), [id]);
  assert.equal(during.messages[0].downloaded_at, downloadedAt);
  assert.equal(during.messages[0].delete_after, plus(downloadedAt, h.config.downloadGraceSeconds));
  assert.equal(during.inbox.message_count, 1);
  assert.equal(during.inbox.quota_used_bytes, raw.length);

  h.clock.advance(1);
  const afterGrace = await poll(inbox);
  assert.deepEqual(afterGrace.messages, []);
  assert.equal(afterGrace.inbox.message_count, 0);
  assert.equal(afterGrace.inbox.quota_used_bytes, 0);
  const gone = await download(inbox, id);
  assert.equal(gone.status, 410);
  assert.deepEqual(gone.json.error.details, { reason: 'downloaded' });

  h.clock.advance(h.config.goneSeconds);
  assert.equal((await download(inbox, id)).status, 404);
});

test('a message deleted by its timer frees its quota for the next delivery', async () => {
  const inbox = await h.provision();
  const quota = inbox.quota_bytes;
  const filler = Buffer.alloc(quota - 10, 0x41);
  const id = await h.deliver(inbox.inbox_id, filler, { pieceBytes: 1024 * 1024 });
  await assert.rejects(h.deliver(inbox.inbox_id, Buffer.alloc(11)), /over quota/);
  assert.equal((await download(inbox, id, 'HEAD')).status, 200);
  assert.equal((await download(inbox, id)).status, 200);
  h.clock.advance(h.config.downloadGraceSeconds - 1);
  await assert.rejects(h.deliver(inbox.inbox_id, Buffer.alloc(11)), /over quota/);
  h.clock.advance(1);
  await h.deliver(inbox.inbox_id, Buffer.alloc(11));
  assert.equal((await status(inbox)).quota_used_bytes, 11);
});

test('at expires_at the inbox is expired: poll answers state expired with no messages but still lists rejections', async () => {
  const inbox = await h.provision();
  const id = await h.deliver(inbox.inbox_id, 'Subject: last\r\n\r\nlast\r\n');
  await h.deliver(inbox.inbox_id, 'Subject: unlisted\r\n\r\nnot polled before expiry\r\n');
  await h.reject(inbox.inbox_id, { envelopeFrom: 'refused@example.net', reason: 'quota', sizeBytes: 77 });
  h.clock.advance(60); // first listed a minute after provisioning, so still held at expiry
  const livePoll = await poll(inbox);
  assert.equal(livePoll.messages.length, 2);
  await h.reject(inbox.inbox_id, { envelopeFrom: 'later@example.net', reason: 'quota', sizeBytes: 88 });

  advanceTo(inbox.expires_at, -1);
  assert.equal((await status(inbox)).state, 'live');
  h.clock.advance(1);
  const expired = await poll(inbox);
  assert.equal(expired.inbox.state, 'expired');
  assert.deepEqual(expired.messages, []);
  assert.deepEqual(
    expired.rejections.map((r: { envelope_from: string }) => r.envelope_from),
    ['refused@example.net', 'later@example.net'],
  );
  assert.equal(expired.has_more, false);
  // Following the cursor of the last live poll: no messages, the new rejection.
  const followed = (await h.api.get(livePoll.next_url, { token: inbox.credentials.owner })).json;
  assert.equal(followed.inbox.state, 'expired');
  assert.deepEqual(followed.messages, []);
  assert.deepEqual(
    followed.rejections.map((r: { envelope_from: string }) => r.envelope_from),
    ['later@example.net'],
  );
  const gone = await download(inbox, id);
  assert.equal(gone.status, 410);
  assert.deepEqual(gone.json.error.details, { reason: 'expired' });
});

test('an expired inbox status keeps its final counts', async () => {
  const inbox = await h.provision();
  const a = 'Subject: a\r\n\r\naaaa\r\n';
  const b = 'Subject: b\r\n\r\nbbbbbbbb\r\n';
  const c = 'Subject: c\r\n\r\ncc\r\n';
  const aId = await h.deliver(inbox.inbox_id, a);
  await h.deliver(inbox.inbox_id, b);
  const cId = await h.deliver(inbox.inbox_id, c);
  await h.reject(inbox.inbox_id, { envelopeFrom: 'x@example.net' });
  await h.reject(inbox.inbox_id, { envelopeFrom: 'y@example.net' });
  // a is downloaded early and deleted before expiry; c is downloaded just before expiry, still held then.
  advanceTo(inbox.expires_at, -h.config.downloadGraceSeconds - 100);
  assert.equal((await download(inbox, aId)).status, 200);
  advanceTo(inbox.expires_at, -10);
  assert.equal((await download(inbox, cId)).status, 200);
  const final = await status(inbox);
  assert.equal(final.message_count, 2);
  assert.equal(final.quota_used_bytes, b.length + c.length);

  advanceTo(inbox.expires_at, 1);
  const expired = await status(inbox);
  assert.equal(expired.state, 'expired');
  assert.equal(expired.message_count, 2);
  assert.equal(expired.quota_used_bytes, b.length + c.length);
  assert.equal(expired.rejection_count, 2);
  h.clock.advance(h.config.purgeAfterSeconds - 2);
  assert.deepEqual(await status(inbox), expired);
  assert.deepEqual((await poll(inbox)).inbox, expired);
});

test('about PURGE_AFTER_SECONDS after expiry the inbox is purged and its credentials answer 401', async () => {
  const inbox = await h.provision();
  await h.deliver(inbox.inbox_id, 'Subject: p\r\n\r\np\r\n');
  advanceTo(inbox.expires_at, h.config.purgeAfterSeconds - 1);
  assert.equal((await status(inbox)).state, 'expired');
  h.clock.advance(1);
  for (const token of [inbox.credentials.owner, inbox.credentials.reader]) {
    for (const path of [`/v1/inboxes/${inbox.inbox_id}`, `/v1/inboxes/${inbox.inbox_id}/messages`]) {
      const response = await h.api.get(path, { token });
      assert.equal(response.status, 401, path);
      assert.equal(response.json.error.code, 'unauthorized');
    }
  }
  const extend = await h.api.post(`/v1/inboxes/${inbox.inbox_id}/extend`, { token: inbox.credentials.owner });
  assert.equal(extend.status, 401, 'an expired inbox cannot be revived');
});

test('an inbox cancelled for abuse answers 410 inbox_cancelled to every call until the end of its paid lifetime, then 401', async () => {
  const inbox = await h.provision();
  const id = await h.deliver(inbox.inbox_id, 'Subject: bad\r\n\r\nbad\r\n');
  await poll(inbox);
  h.clock.advance(100);
  const cancelledAt = iso(h.clock.now());
  await h.container.resolve<InboxService>(TOKENS.InboxService).cancel(inbox.inbox_id);
  const calls: [string, string, string][] = [
    ['GET', `/v1/inboxes/${inbox.inbox_id}`, inbox.credentials.reader],
    ['GET', `/v1/inboxes/${inbox.inbox_id}/messages`, inbox.credentials.reader],
    ['GET', `/v1/inboxes/${inbox.inbox_id}/messages/${id}`, inbox.credentials.owner],
    ['POST', `/v1/inboxes/${inbox.inbox_id}/extend`, inbox.credentials.owner],
  ];
  for (const [method, path, token] of calls) {
    const response = await h.api.request(method, path, { token });
    assert.equal(response.status, 410, `${method} ${path}`);
    assert.equal(response.json.error.code, 'inbox_cancelled');
    assert.deepEqual(response.json.error.details, { reason: 'abuse', cancelled_at: cancelledAt });
  }
  advanceTo(inbox.expires_at, -1);
  const lastMoment = await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, {
    token: inbox.credentials.reader,
  });
  assert.equal(lastMoment.status, 410);
  h.clock.advance(1);
  for (const [method, path, token] of calls) {
    const response = await h.api.request(method, path, { token });
    assert.equal(response.status, 401, `${method} ${path}`);
  }
});

test('extending keeps the inbox live past its first expiry and its messages keep their delete_after', async () => {
  const inbox = await h.provision();
  const id = await h.deliver(inbox.inbox_id, 'Subject: ext\r\n\r\next\r\n');
  advanceTo(inbox.expires_at, -h.config.unclaimedSeconds + 100);
  const listed = await poll(inbox);
  const extended = await h.api.post(`/v1/inboxes/${inbox.inbox_id}/extend`, {
    token: inbox.credentials.owner,
  });
  assert.equal(extended.status, 200);
  advanceTo(inbox.expires_at, 50);
  const after = await poll(inbox);
  assert.equal(after.inbox.state, 'live');
  assert.deepEqual(ids(after), [id]);
  assert.equal(after.messages[0].delete_after, listed.messages[0].delete_after);
  advanceTo(listed.messages[0].delete_after);
  assert.deepEqual((await poll(inbox)).messages, []);
});
