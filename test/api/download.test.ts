/**
 * Download and inspect: GET and HEAD /v1/inboxes/{id}/messages/{msg_id} (contract section 4), byte
 * ranges over the 256 KiB stored chunks (DESIGN decision 7), the deletion timer (section 3), and one
 * test per row of the download error table.
 */
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { after, before, test } from 'node:test';
import pg from 'pg';
import { TOKENS } from '../../src/container.ts';
import { newMessageId } from '../../src/core/ids.ts';
import type { InboxService, ProvisionedInbox } from '../../src/core/inbox-service.ts';
import { expectError, iso, plus } from '../support/assertions.ts';
import { type ApiResponse, type Harness, startHarness } from '../support/harness.ts';

let h: Harness;
// A large message shared by the range tests: 6.5 chunks, delivered in odd-sized pieces.
const CHUNK = 256 * 1024;
const BIG_SIZE = 1_700_001;
let bigInbox: ProvisionedInbox;
let big: Buffer;
let bigId: string;

before(async () => {
  h = await startHarness({ POLL_RATE_BURST: '100000' });
  bigInbox = await h.provision();
  big = binaryMessage(BIG_SIZE);
  bigId = await h.deliver(bigInbox.inbox_id, big, { pieceBytes: 100_003 });
});
after(() => h.close());

const messagePath = (inbox: ProvisionedInbox, messageId: string) =>
  `/v1/inboxes/${inbox.inbox_id}/messages/${messageId}`;

/** A message of exactly `size` bytes: headers, every byte value 0-255, CRLF, lone CR and LF, random bytes. */
function binaryMessage(size: number): Buffer {
  const head = Buffer.from('From: Bin <bin@example.org>\r\nSubject: binary\r\nMIME-Version: 1.0\r\n\r\n');
  const every = Buffer.from(Array.from({ length: 256 }, (_, i) => i));
  const line = Buffer.from('\r\nline\rlone CR\nlone LF\r\n\0');
  const fixed = Buffer.concat([head, every, line]);
  assert.ok(size > fixed.length);
  return Buffer.concat([fixed, randomBytes(size - fixed.length)]);
}

async function download(
  inbox: ProvisionedInbox,
  messageId: string,
  headers: Record<string, string> = {},
  method = 'GET',
): Promise<ApiResponse> {
  return h.api.request(method, messagePath(inbox, messageId), { token: inbox.credentials.reader, headers });
}

async function listed(inbox: ProvisionedInbox, messageId: string) {
  const response = await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, {
    token: inbox.credentials.reader,
  });
  assert.equal(response.status, 200);
  return {
    serverTime: response.json.server_time as string,
    message: response.json.messages.find((m: { message_id: string }) => m.message_id === messageId),
  };
}

function assertDownloadHeaders(response: ApiResponse, contentLength: number): void {
  assert.equal(response.headers.get('content-type'), 'message/rfc822');
  assert.equal(response.headers.get('content-length'), String(contentLength));
  assert.equal(response.headers.get('accept-ranges'), 'bytes');
  assert.equal(response.headers.get('cache-control'), 'no-store');
  assert.match(response.headers.get('etag') ?? '', /^"[^"]+"$/);
}

test('download answers 200 with the raw message byte-exact and the download headers', async () => {
  const response = await download(bigInbox, bigId);
  assert.equal(response.status, 200);
  assertDownloadHeaders(response, BIG_SIZE);
  assert.equal(response.headers.get('content-range'), null);
  assert.equal(response.bytes.length, BIG_SIZE);
  assert.ok(response.bytes.equals(big), 'the body differs from the message as delivered');
});

test('a message stored in pieces of 1, 7, 262143 and 262145 bytes downloads byte-exact', async () => {
  const inbox = await h.provision();
  for (const pieceBytes of [1, 7, CHUNK - 1, CHUNK + 1]) {
    const raw = binaryMessage(pieceBytes === 1 ? CHUNK + 1000 : 2 * CHUNK + 17);
    const id = await h.deliver(inbox.inbox_id, raw, { pieceBytes });
    const response = await download(inbox, id);
    assert.equal(response.status, 200);
    assert.ok(response.bytes.equals(raw), `pieces of ${pieceBytes} bytes`);
  }
});

test('a message of exactly one and exactly four chunks downloads byte-exact', async () => {
  const inbox = await h.provision();
  for (const size of [CHUNK, 4 * CHUNK]) {
    const raw = binaryMessage(size);
    const id = await h.deliver(inbox.inbox_id, raw, { pieceBytes: CHUNK });
    const response = await download(inbox, id);
    assert.equal(response.headers.get('content-length'), String(size));
    assert.ok(response.bytes.equals(raw), `${size} bytes`);
  }
});

test('an empty message downloads as 0 bytes', async () => {
  const inbox = await h.provision();
  const id = await h.deliver(inbox.inbox_id, Buffer.alloc(0));
  const response = await download(inbox, id);
  assert.equal(response.status, 200);
  assertDownloadHeaders(response, 0);
  assert.equal(response.bytes.length, 0);
});

test('the ETag is the same on every download and differs between messages', async () => {
  const inbox = await h.provision();
  const a = await h.deliver(inbox.inbox_id, 'Subject: a\r\n\r\na\r\n');
  const b = await h.deliver(inbox.inbox_id, 'Subject: b\r\n\r\nb\r\n');
  const first = (await download(inbox, a)).headers.get('etag');
  const second = (await download(inbox, a)).headers.get('etag');
  const ranged = (await download(inbox, a, { Range: 'bytes=0-3' })).headers.get('etag');
  const inspected = (await download(inbox, a, {}, 'HEAD')).headers.get('etag');
  const other = (await download(inbox, b)).headers.get('etag');
  assert.ok(first);
  assert.equal(second, first);
  assert.equal(ranged, first);
  assert.equal(inspected, first);
  assert.notEqual(other, first);
  assert.equal(first, `"${a}"`, 'a message stored now is tagged with its id');
});

test('a message stored with a content digest (before the mail path stopped hashing) keeps it as its ETag', async () => {
  const inbox = await h.provision();
  const raw = 'Subject: old\r\n\r\nold\r\n';
  const id = await h.deliver(inbox.inbox_id, raw);
  const digest = createHash('sha256').update(raw).digest();
  await sql('UPDATE messages SET sha256 = $1 WHERE inbox_id = $2 AND message_id = $3', [
    digest,
    inbox.inbox_id,
    id,
  ]);
  const response = await download(inbox, id);
  assert.equal(response.status, 200);
  assert.equal(response.headers.get('etag'), `"${digest.toString('base64url')}"`);
});

async function assertRange(range: string, start: number, end: number): Promise<void> {
  const response = await download(bigInbox, bigId, { Range: range });
  assert.equal(response.status, 206, `${range}: ${response.status}`);
  assertDownloadHeaders(response, end - start + 1);
  assert.equal(response.headers.get('content-range'), `bytes ${start}-${end}/${BIG_SIZE}`, range);
  assert.equal(response.bytes.length, end - start + 1, range);
  assert.ok(response.bytes.equals(big.subarray(start, end + 1)), `${range}: wrong bytes`);
}

test('Range bytes=0-99 answers 206 with Content-Range bytes 0-99/size and the first 100 bytes', async () => {
  await assertRange('bytes=0-99', 0, 99);
});

test('Range bytes=100- answers 206 with everything from byte 100', async () => {
  await assertRange('bytes=100-', 100, BIG_SIZE - 1);
});

test('Range bytes=-50 answers 206 with the last 50 bytes', async () => {
  await assertRange('bytes=-50', BIG_SIZE - 50, BIG_SIZE - 1);
});

test('the range unit is matched in any case (RFC 9110): Bytes=0-3 and BYTES=-50 answer 206', async () => {
  await assertRange('Bytes=0-3', 0, 3);
  await assertRange('BYTES=-50', BIG_SIZE - 50, BIG_SIZE - 1);
});

test('ranges crossing stored chunk boundaries answer the exact bytes', async () => {
  await assertRange('bytes=262140-262150', 262140, 262150);
  await assertRange(`bytes=${CHUNK}-${CHUNK}`, CHUNK, CHUNK);
  await assertRange(`bytes=${CHUNK - 1}-${CHUNK - 1}`, CHUNK - 1, CHUNK - 1);
  await assertRange('bytes=1048570-1048580', 1048570, 1048580);
  await assertRange('bytes=300000-1400000', 300000, 1400000);
  await assertRange(`bytes=100-${BIG_SIZE - 100}`, 100, BIG_SIZE - 100);
  await assertRange(`bytes=${5 * CHUNK + 3}-`, 5 * CHUNK + 3, BIG_SIZE - 1);
});

test('a range ending past the end is served up to the last byte', async () => {
  await assertRange(`bytes=${BIG_SIZE - 10}-${BIG_SIZE + 1000}`, BIG_SIZE - 10, BIG_SIZE - 1);
  await assertRange(`bytes=-${BIG_SIZE + 5}`, 0, BIG_SIZE - 1);
  await assertRange(`bytes=0-${BIG_SIZE - 1}`, 0, BIG_SIZE - 1);
});

test("If-Range: the range applies with this message's ETag; with another validator the whole message is served", async () => {
  const inbox = await h.provision();
  const raw = 'Subject: if-range\r\n\r\n0123456789\r\n';
  const id = await h.deliver(inbox.inbox_id, raw);
  const etag = (await download(inbox, id)).headers.get('etag') as string;
  const matching = await download(inbox, id, { Range: 'bytes=0-3', 'If-Range': etag });
  assert.equal(matching.status, 206);
  assert.equal(matching.text, raw.slice(0, 4));
  // RFC 9110 13.1.5: the validator does not match, so the Range header is ignored.
  for (const validator of ['"not-this-etag"', 'Wed, 21 Oct 2026 07:28:00 GMT']) {
    const other = await download(inbox, id, { Range: 'bytes=0-3', 'If-Range': validator });
    assert.equal(other.status, 200, validator);
    assert.equal(other.headers.get('content-range'), null, validator);
    assert.equal(other.text, raw, validator);
  }
});

test('several ranges are ignored and the whole message is served with 200', async () => {
  const inbox = await h.provision();
  const raw = 'Subject: multi\r\n\r\n0123456789\r\n';
  const id = await h.deliver(inbox.inbox_id, raw);
  const response = await download(inbox, id, { Range: 'bytes=0-1,5-6' });
  assert.equal(response.status, 200);
  assert.equal(response.headers.get('content-range'), null);
  assertDownloadHeaders(response, raw.length);
  assert.equal(response.text, raw);
});

test('a Range header that is not a valid byte range is ignored and the whole message is served with 200', async () => {
  const inbox = await h.provision();
  const raw = 'Subject: odd\r\n\r\n0123456789\r\n';
  const id = await h.deliver(inbox.inbox_id, raw);
  for (const range of ['bytes=5-2', 'items=0-5', 'bytes=abc', 'bytes=-']) {
    const response = await download(inbox, id, { Range: range });
    assert.equal(response.status, 200, range);
    assert.equal(response.headers.get('content-range'), null, range);
    assert.equal(response.text, raw, range);
  }
});

test('416 range_not_satisfiable: a range past the end carries Content-Range bytes */size and details.size_bytes', async () => {
  const inbox = await h.provision();
  const raw = 'Subject: short\r\n\r\nshort\r\n';
  const id = await h.deliver(inbox.inbox_id, raw);
  for (const range of [`bytes=${raw.length}-`, `bytes=${raw.length}-${raw.length + 10}`, 'bytes=9999-']) {
    const response = await download(inbox, id, { Range: range });
    expectError(response, 416, 'range_not_satisfiable');
    assert.equal(response.headers.get('content-range'), `bytes */${raw.length}`, range);
    assert.deepEqual(response.json.error.details, { size_bytes: raw.length });
  }
  const inspected = await download(inbox, id, { Range: 'bytes=9999-' }, 'HEAD');
  assert.equal(inspected.status, 416);
  assert.equal(inspected.headers.get('content-range'), `bytes */${raw.length}`);
  // A refused range is not a download: the timer has not started.
  const { message } = await listed(inbox, id);
  assert.equal(message.downloaded_at, null);
});

test('HEAD answers the download headers without a body and does not start the deletion timer', async () => {
  const inbox = await h.provision();
  const raw = 'Subject: inspect\r\n\r\nlook but do not touch\r\n';
  const id = await h.deliver(inbox.inbox_id, raw);
  const first = await listed(inbox, id);
  h.clock.advance(5);
  const response = await download(inbox, id, {}, 'HEAD');
  assert.equal(response.status, 200);
  assertDownloadHeaders(response, raw.length);
  assert.equal(response.bytes.length, 0);
  const after = await listed(inbox, id);
  assert.equal(after.message.downloaded_at, null);
  assert.equal(after.message.delete_after, first.message.delete_after);
});

test('HEAD with a Range answers 200 with the ranged Content-Length and Content-Range', async () => {
  const response = await download(bigInbox, bigId, { Range: 'bytes=262140-262150' }, 'HEAD');
  assert.equal(response.status, 200);
  assertDownloadHeaders(response, 11);
  assert.equal(response.headers.get('content-range'), `bytes 262140-262150/${BIG_SIZE}`);
  assert.equal(response.bytes.length, 0);
});

test('GET sets downloaded_at and moves delete_after to DOWNLOAD_GRACE_SECONDS out', async () => {
  const inbox = await h.provision();
  const id = await h.deliver(inbox.inbox_id, 'Subject: timer\r\n\r\ntimer\r\n');
  const first = await listed(inbox, id);
  assert.equal(first.message.downloaded_at, null);
  h.clock.advance(42);
  const downloadedAt = iso(h.clock.now());
  assert.equal((await download(inbox, id)).status, 200);
  const after = await listed(inbox, id);
  assert.equal(after.message.downloaded_at, downloadedAt);
  assert.equal(after.message.delete_after, plus(downloadedAt, h.config.downloadGraceSeconds));
});

test('a ranged GET counts as a download', async () => {
  const inbox = await h.provision();
  const id = await h.deliver(inbox.inbox_id, 'Subject: ranged\r\n\r\nranged\r\n');
  await listed(inbox, id);
  const downloadedAt = iso(h.clock.now());
  assert.equal((await download(inbox, id, { Range: 'bytes=0-0' })).status, 206);
  const after = await listed(inbox, id);
  assert.equal(after.message.downloaded_at, downloadedAt);
  assert.equal(after.message.delete_after, plus(downloadedAt, h.config.downloadGraceSeconds));
});

test('downloading again keeps the first downloaded_at and delete_after', async () => {
  const inbox = await h.provision();
  const raw = 'Subject: twice\r\n\r\ntwice\r\n';
  const id = await h.deliver(inbox.inbox_id, raw);
  const downloadedAt = iso(h.clock.now());
  await download(inbox, id);
  h.clock.advance(60);
  const again = await download(inbox, id);
  assert.equal(again.status, 200);
  assert.equal(again.text, raw);
  const after = await listed(inbox, id);
  assert.equal(after.message.downloaded_at, downloadedAt);
  assert.equal(after.message.delete_after, plus(downloadedAt, h.config.downloadGraceSeconds));
});

test('GET near the end of the unclaimed window keeps the earlier delete_after', async () => {
  const inbox = await h.provision();
  const id = await h.deliver(inbox.inbox_id, 'Subject: late\r\n\r\nlate\r\n');
  const first = await listed(inbox, id);
  h.clock.advance(h.config.unclaimedSeconds - 60);
  assert.equal((await download(inbox, id)).status, 200);
  const after = await listed(inbox, id);
  assert.equal(after.message.downloaded_at, iso(h.clock.now()));
  assert.equal(after.message.delete_after, first.message.delete_after);
});

// The download error table, row by row.

test('401 unauthorized: download without a credential, with a malformed one or with another inbox credential', async () => {
  const inbox = await h.provision();
  const other = await h.provision();
  const id = await h.deliver(inbox.inbox_id, 'Subject: secret\r\n\r\nsecret\r\n');
  const path = messagePath(inbox, id);
  for (const token of [undefined, 'rmr_short', other.credentials.reader, other.credentials.owner]) {
    expectError(await h.api.get(path, token === undefined ? {} : { token }), 401, 'unauthorized');
    assert.equal((await h.api.head(path, token === undefined ? {} : { token })).status, 401);
  }
  // The credential is checked before the message id.
  expectError(await h.api.get(messagePath(inbox, 'nonsense'), {}), 401, 'unauthorized');
});

test('404 message_not_found: no such message in this inbox', async () => {
  const inbox = await h.provision();
  const other = await h.provision();
  const elsewhere = await h.deliver(other.inbox_id, 'Subject: theirs\r\n\r\ntheirs\r\n');
  for (const id of [newMessageId(), elsewhere]) {
    expectError(await download(inbox, id), 404, 'message_not_found');
    assert.equal((await download(inbox, id, {}, 'HEAD')).status, 404);
  }
});

test('404 message_not_found: a malformed message id, whatever inbox the credential is for', async () => {
  const inbox = await h.provision();
  const other = await h.provision();
  const malformed = [
    'nonsense',
    'msg_',
    `msg_${'u'.repeat(20)}`,
    `msg_${'A'.repeat(20)}`,
    `msg_${'a'.repeat(21)}`,
  ];
  for (const id of malformed) {
    expectError(await download(inbox, id), 404, 'message_not_found');
    assert.equal((await download(inbox, id, {}, 'HEAD')).status, 404);
    // Request shape comes before "is this credential the inbox's own" (contract section 4 check order).
    const foreign = await h.api.get(messagePath(inbox, id), { token: other.credentials.reader });
    expectError(foreign, 404, 'message_not_found');
  }
});

test('404 message_not_found: a delivery still in flight', async () => {
  const inbox = await h.provision();
  const messageId = newMessageId();
  const reserved = await h.messages.reserve({
    inboxId: inbox.inbox_id,
    messageId,
    queueId: `FLIGHT${Date.now()}`,
    sizeBytes: 1234,
    envelopeFrom: 'slow@example.com',
    now: h.clock.now(),
  });
  assert.equal(reserved, 'reserved');
  expectError(await download(inbox, messageId), 404, 'message_not_found');
  assert.equal((await download(inbox, messageId, {}, 'HEAD')).status, 404);
});

test('410 message_gone: download of a message deleted within the hour after its download answers reason downloaded', async () => {
  const inbox = await h.provision();
  const id = await h.deliver(inbox.inbox_id, 'Subject: once\r\n\r\nonce\r\n');
  assert.equal((await download(inbox, id)).status, 200);
  h.clock.advance(h.config.downloadGraceSeconds - 1);
  assert.equal((await download(inbox, id)).status, 200, 'still inside the grace window');
  h.clock.advance(1);
  const gone = await download(inbox, id);
  expectError(gone, 410, 'message_gone');
  assert.deepEqual(gone.json.error.details, { reason: 'downloaded' });
  assert.equal((await download(inbox, id, {}, 'HEAD')).status, 410);
  assert.equal((await listed(inbox, id)).message, undefined);
});

test('404 message_not_found: a message deleted more than GONE_SECONDS ago', async () => {
  const inbox = await h.provision();
  const id = await h.deliver(inbox.inbox_id, 'Subject: old\r\n\r\nold\r\n');
  assert.equal((await download(inbox, id)).status, 200);
  h.clock.advance(h.config.downloadGraceSeconds + h.config.goneSeconds - 1);
  expectError(await download(inbox, id), 410, 'message_gone');
  h.clock.advance(1);
  expectError(await download(inbox, id), 404, 'message_not_found');
  assert.equal((await download(inbox, id, {}, 'HEAD')).status, 404);
});

test('410 message_gone: a listed message never downloaded is gone UNCLAIMED_SECONDS after its first listing, reason unclaimed', async () => {
  const inbox = await h.provision();
  await h.api.post(`/v1/inboxes/${inbox.inbox_id}/extend`, { token: inbox.credentials.owner });
  const id = await h.deliver(inbox.inbox_id, 'Subject: ignored\r\n\r\nignored\r\n');
  h.clock.advance(100);
  await listed(inbox, id);
  h.clock.advance(h.config.unclaimedSeconds - 1);
  assert.equal((await download(inbox, id, {}, 'HEAD')).status, 200);
  h.clock.advance(1);
  const gone = await download(inbox, id);
  expectError(gone, 410, 'message_gone');
  assert.deepEqual(gone.json.error.details, { reason: 'unclaimed' });
  h.clock.advance(h.config.goneSeconds);
  expectError(await download(inbox, id), 404, 'message_not_found');
});

test('410 message_gone: a message of an expired inbox answers reason expired until the inbox is purged', async () => {
  const inbox = await h.provision();
  const listedId = await h.deliver(inbox.inbox_id, 'Subject: listed\r\n\r\nlisted\r\n');
  h.clock.advance(10); // listed after provisioning, so its unclaimed timer ends after the expiry
  await listed(inbox, listedId);
  const unlistedId = await h.deliver(inbox.inbox_id, 'Subject: unlisted\r\n\r\nunlisted\r\n');
  h.clock.advance(Date.parse(inbox.expires_at) / 1000 - h.clock.now().getTime() / 1000);
  for (const id of [listedId, unlistedId]) {
    const gone = await download(inbox, id);
    expectError(gone, 410, 'message_gone');
    assert.deepEqual(gone.json.error.details, { reason: 'expired' });
  }
  h.clock.advance(h.config.purgeAfterSeconds);
  expectError(await download(inbox, listedId), 401, 'unauthorized');
});

test('410 message_gone: a message whose stored copy is missing answers reason lost', async () => {
  const inbox = await h.provision();
  const raw = binaryMessage(3 * CHUNK + 5);
  const id = await h.deliver(inbox.inbox_id, raw);
  const lostWhole = await h.deliver(inbox.inbox_id, 'Subject: lost\r\n\r\nlost\r\n');
  // Simulate storage losing the stored copy (contract section 3: "should not happen; logged").
  await sql('DELETE FROM message_chunks WHERE message_id = $1 AND seq = 2', [id]);
  await sql('DELETE FROM message_chunks WHERE message_id = $1', [lostWhole]);
  for (const messageId of [id, lostWhole]) {
    const gone = await download(inbox, messageId);
    expectError(gone, 410, 'message_gone');
    assert.deepEqual(gone.json.error.details, { reason: 'lost' });
    assert.equal((await download(inbox, messageId, {}, 'HEAD')).status, 410);
    assert.equal((await listed(inbox, messageId)).message, undefined, 'a lost message is not listed');
  }
  const status = await h.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.reader });
  assert.equal(status.json.message_count, 0, 'a lost message no longer counts');
  // What was left of the copy goes with it, as when delete-messages finds it (jobs review: the chunks
  // stayed until the tombstone went, up to RESERVATION_TTL_SECONDS later).
  assert.deepEqual(await sql('SELECT seq FROM message_chunks WHERE message_id = $1', [id]), []);
  h.clock.advance(h.config.goneSeconds);
  expectError(await download(inbox, id), 404, 'message_not_found');
});

test('410 inbox_cancelled: download from an inbox cancelled for abuse', async () => {
  const inbox = await h.provision();
  const id = await h.deliver(inbox.inbox_id, 'Subject: abuse\r\n\r\nabuse\r\n');
  const cancelledAt = iso(h.clock.now());
  assert.equal(
    await h.container.resolve<InboxService>(TOKENS.InboxService).cancel(inbox.inbox_id),
    'cancelled',
  );
  for (const token of [inbox.credentials.reader, inbox.credentials.owner]) {
    const response = await h.api.get(messagePath(inbox, id), { token });
    expectError(response, 410, 'inbox_cancelled');
    assert.deepEqual(response.json.error.details, { reason: 'abuse', cancelled_at: cancelledAt });
  }
  assert.equal((await download(inbox, id, {}, 'HEAD')).status, 410);
  expectError(await download(inbox, newMessageId()), 410, 'inbox_cancelled');
});

test('429 rate_limited: downloads have their own limit, and poll still answers while it is spent', async () => {
  const inbox = await h.provision();
  const raw = 'Subject: many\r\n\r\nmany\r\n';
  const id = await h.deliver(inbox.inbox_id, raw);
  let refused: ApiResponse | undefined;
  for (let i = 0; i <= h.config.downloadRateBurst + 5 && !refused; i++) {
    const response = await download(inbox, id, {}, 'HEAD');
    if (response.status === 429) refused = response;
    else assert.equal(response.status, 200);
  }
  assert.ok(refused, 'the download limit was never reached');
  assert.ok(Number(refused.headers.get('retry-after')) >= 1);
  const limited = await download(inbox, id);
  expectError(limited, 429, 'rate_limited');
  const retryAfter = Number(limited.headers.get('retry-after'));
  assert.equal(limited.json.error.details.retry_after_seconds, retryAfter);
  assert.ok(Number.isInteger(retryAfter) && retryAfter >= 1);

  const polled = await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, {
    token: inbox.credentials.reader,
  });
  assert.equal(polled.status, 200);
  assert.equal(polled.json.messages[0].downloaded_at, null, 'a refused GET does not start the timer');

  h.clock.advance(retryAfter);
  const retried = await download(inbox, id);
  assert.equal(retried.status, 200);
  assert.equal(retried.text, raw);
});

test('500 internal: a storage failure answers internal with no detail but the request id', async () => {
  const inbox = await h.provision();
  const id = await h.deliver(inbox.inbox_id, 'Subject: fault\r\n\r\nfault\r\n');
  await sql('ALTER TABLE messages RENAME TO messages_unavailable');
  try {
    const response = await h.api.get(messagePath(inbox, id), {
      token: inbox.credentials.reader,
      headers: { 'X-Request-Id': 'req-download-500' },
    });
    expectError(response, 500, 'internal');
    assert.equal(response.json.error.details, undefined);
    assert.match(response.json.error.message, /req-download-500/);
    assert.doesNotMatch(response.json.error.message, /messages|relation|select/i);
    assert.equal(response.headers.get('x-request-id'), 'req-download-500');
    assert.equal((await download(inbox, id, {}, 'HEAD')).status, 500);
  } finally {
    await sql('ALTER TABLE messages_unavailable RENAME TO messages');
  }
  assert.equal((await download(inbox, id)).status, 200);
});

test('the reader and the owner credential both download', async () => {
  const inbox = await h.provision();
  const raw = 'Subject: both\r\n\r\nboth\r\n';
  const id = await h.deliver(inbox.inbox_id, raw);
  for (const token of [inbox.credentials.reader, inbox.credentials.owner]) {
    const response = await h.api.get(messagePath(inbox, id), { token });
    assert.equal(response.status, 200);
    assert.equal(response.text, raw);
  }
});

/** Fault injection only: the test database is this file's own clone. */
async function sql(text: string, values: unknown[] = []): Promise<unknown[]> {
  const client = new pg.Client({ connectionString: h.database.url });
  await client.connect();
  try {
    return (await client.query(text, values)).rows;
  } finally {
    await client.end();
  }
}
