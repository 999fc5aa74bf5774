/**
 * Storage's two delivery paths meet at CHUNK_BYTES: a message that fits in one chunk is stored with
 * one call (store_whole_message), a longer one streams chunk by chunk in a transaction. Each size at and
 * around the boundary, in pieces that do and do not line up with it, downloads byte-exact with its size
 * and digest, in the number of chunks its size implies; a redelivery of the same queue id on either
 * path stores nothing and answers with the first delivery's message id.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { TOKENS } from '../../src/container.ts';
import type { Database } from '../../src/storage/database.ts';
import { CHUNK_BYTES } from '../../src/storage/message-store.ts';
import { type Harness, startHarness } from '../support/harness.ts';

let h: Harness;
before(async () => {
  h = await startHarness();
});
after(() => h.close());
const db = () => h.container.resolve<Database>(TOKENS.Database);

function pattern(size: number): Buffer {
  const bytes = Buffer.alloc(size);
  for (let i = 0; i < size; i++) bytes[i] = (i * 31 + (i >> 8)) & 0xff;
  return bytes;
}

async function chunkSizes(inboxId: string, messageId: string): Promise<number[]> {
  const rows = await db().rows<{ n: number }>(
    'test-chunk-sizes',
    'SELECT octet_length(data) AS n FROM message_chunks WHERE inbox_id = $1 AND message_id = $2 ORDER BY seq',
    [inboxId, messageId],
  );
  return rows.map((row) => row.n);
}

const cases = [
  { size: 1, pieceBytes: 1, chunks: [1] },
  { size: 10 * 1024, pieceBytes: 4096, chunks: [10 * 1024] },
  { size: CHUNK_BYTES, pieceBytes: CHUNK_BYTES, chunks: [CHUNK_BYTES] },
  { size: CHUNK_BYTES, pieceBytes: 1000, chunks: [CHUNK_BYTES] },
  { size: CHUNK_BYTES + 1, pieceBytes: CHUNK_BYTES, chunks: [CHUNK_BYTES, 1] },
  { size: CHUNK_BYTES + 1, pieceBytes: CHUNK_BYTES + 1, chunks: [CHUNK_BYTES, 1] },
  { size: 2 * CHUNK_BYTES + 5, pieceBytes: 65_536, chunks: [CHUNK_BYTES, CHUNK_BYTES, 5] },
];

for (const c of cases) {
  test(`${c.size} bytes in pieces of ${c.pieceBytes}: ${c.chunks.length} chunk(s), byte-exact`, async () => {
    const inbox = await h.provision();
    const raw = pattern(c.size);
    const id = await h.deliver(inbox.inbox_id, raw, { pieceBytes: c.pieceBytes });
    assert.deepEqual(await chunkSizes(inbox.inbox_id, id), c.chunks);
    const response = await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages/${id}`, {
      token: inbox.credentials.reader,
    });
    assert.equal(response.status, 200);
    assert.ok(response.bytes.equals(raw), 'the download differs from the message as delivered');
    assert.equal(response.headers.get('etag'), `"${id}"`);
    const status = await h.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.reader });
    assert.equal(status.json.quota_used_bytes, c.size);
    assert.equal(status.json.message_count, 1);
  });
}

for (const size of [100, CHUNK_BYTES + 100]) {
  test(`a redelivered queue id of ${size} bytes stores nothing and answers the first message id`, async () => {
    const inbox = await h.provision();
    const raw = pattern(size);
    const first = await h.deliver(inbox.inbox_id, raw, { queueId: `REDELIVER${size}` });
    const again = await h.deliver(inbox.inbox_id, pattern(size).reverse(), { queueId: `REDELIVER${size}` });
    assert.equal(again, first);
    const [row] = await db().rows<{ n: number; bytes: number }>(
      'test-message-count',
      `SELECT count(*)::int AS n, sum(size_bytes)::int AS bytes FROM messages WHERE inbox_id = $1`,
      [inbox.inbox_id],
    );
    assert.deepEqual(row, { n: 1, bytes: size });
    const response = await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages/${first}`, {
      token: inbox.credentials.reader,
    });
    assert.ok(response.bytes.equals(raw), 'the first delivery is the one kept');
  });
}
