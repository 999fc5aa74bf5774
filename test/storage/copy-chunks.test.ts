/**
 * A streamed message's chunks go in with one binary COPY (src/storage/copy-chunks.ts): the bytes
 * arrive cut at CHUNK_BYTES whatever the pieces; a body that fails cancels the COPY and stores nothing;
 * a database error during the COPY is thrown, not hung on; the connection is usable afterwards. Text is
 * stored lz4-compressed (migration 20261126000000), what does not compress as it is.
 */
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { after, before, test } from 'node:test';
import { TOKENS } from '../../src/container.ts';
import { copyChunks } from '../../src/storage/copy-chunks.ts';
import type { Database } from '../../src/storage/database.ts';
import { CHUNK_BYTES } from '../../src/storage/message-store.ts';
import { type Harness, startHarness } from '../support/harness.ts';

let h: Harness;
let db: Database;
before(async () => {
  h = await startHarness();
  db = h.container.resolve<Database>(TOKENS.Database);
});
after(() => h.close());

async function* pieces(data: Buffer, size: number, failAfter?: number): AsyncIterable<Buffer> {
  for (let at = 0; at < data.length; at += size) {
    if (failAfter !== undefined && at >= failAfter) throw new Error('the sender went away');
    yield data.subarray(at, at + size);
  }
}

/** A message row in flight to copy chunks for, in the caller's transaction. */
async function inFlight(client: import('pg').PoolClient, inboxId: string, messageId: string) {
  await client.query(`SELECT begin_delivery($1, $2, $3, '', now())`, [inboxId, messageId, `Q${messageId}`]);
}

test('chunks are cut at CHUNK_BYTES whatever the pieces, and hold the bytes as sent', async () => {
  const inbox = await h.provision();
  const data = randomBytes(2 * CHUNK_BYTES + 12_345);
  const result = await db.transaction(async (client) => {
    await inFlight(client, inbox.inbox_id, 'msg_copy_ok');
    return copyChunks(client, inbox.inbox_id, 'msg_copy_ok', pieces(data, 65_521), CHUNK_BYTES);
  });
  assert.equal(result.size, data.length);
  const rows = await db.rows<{ seq: number; length: number; md5: string }>(
    'test-chunks',
    `SELECT seq, octet_length(data) AS length, md5(data) AS md5 FROM message_chunks
     WHERE inbox_id = $1 AND message_id = 'msg_copy_ok' ORDER BY seq`,
    [inbox.inbox_id],
  );
  const md5 = (b: Buffer) => createHash('md5').update(b).digest('hex');
  assert.deepEqual(rows, [
    { seq: 0, length: CHUNK_BYTES, md5: md5(data.subarray(0, CHUNK_BYTES)) },
    { seq: 1, length: CHUNK_BYTES, md5: md5(data.subarray(CHUNK_BYTES, 2 * CHUNK_BYTES)) },
    { seq: 2, length: 12_345, md5: md5(data.subarray(2 * CHUNK_BYTES)) },
  ]);
});

test('text chunks are stored lz4-compressed and random ones as they are; both read back exact, at full length', async () => {
  const inbox = await h.provision();
  const text = Buffer.from('<p>Confirm your address: follow the link below.</p>\r\n'.repeat(12_000));
  const random = randomBytes(CHUNK_BYTES + 1000);
  for (const [id, data] of [
    ['msg_lz4_text', text],
    ['msg_lz4_random', random],
  ] as const) {
    await db.transaction(async (client) => {
      await inFlight(client, inbox.inbox_id, id);
      return copyChunks(client, inbox.inbox_id, id, pieces(data, 65_536), CHUNK_BYTES);
    });
  }
  const rows = await db.rows<{
    message_id: string;
    compression: string | null;
    length: number;
    data: Buffer;
  }>(
    'test-compression',
    `SELECT message_id, pg_column_compression(data) AS compression, octet_length(data) AS length, data
     FROM message_chunks WHERE inbox_id = $1 ORDER BY message_id, seq`,
    [inbox.inbox_id],
  );
  const of = (id: string) => rows.filter((row) => row.message_id === id);
  assert.deepEqual(
    of('msg_lz4_text').map((row) => row.compression),
    ['lz4', 'lz4', 'lz4'],
  );
  assert.deepEqual(
    of('msg_lz4_random').map((row) => row.compression),
    [null, null],
  );
  for (const [id, data] of [
    ['msg_lz4_text', text],
    ['msg_lz4_random', random],
  ] as const) {
    assert.ok(Buffer.concat(of(id).map((row) => row.data)).equals(data), `${id} reads back exact`);
    assert.equal(
      of(id).reduce((sum, row) => sum + row.length, 0),
      data.length,
    );
  }
});

test('a body that fails mid-message cancels the COPY: its error is thrown and nothing is stored', async () => {
  const inbox = await h.provision();
  const data = randomBytes(3 * CHUNK_BYTES);
  await assert.rejects(
    db.transaction(async (client) => {
      await inFlight(client, inbox.inbox_id, 'msg_copy_cut');
      return copyChunks(
        client,
        inbox.inbox_id,
        'msg_copy_cut',
        pieces(data, 65_536, CHUNK_BYTES + 65_536),
        CHUNK_BYTES,
      );
    }),
    /the sender went away/,
  );
  const [left] = await db.rows<{ messages: number; chunks: number }>(
    'test-left',
    `SELECT (SELECT count(*)::int FROM messages WHERE inbox_id = $1) AS messages,
            (SELECT count(*)::int FROM message_chunks WHERE inbox_id = $1) AS chunks`,
    [inbox.inbox_id],
  );
  assert.deepEqual(left, { messages: 0, chunks: 0 });
});

test('a database error during the COPY is thrown, and the pool goes on working', async () => {
  const inbox = await h.provision();
  const data = randomBytes(4 * CHUNK_BYTES);
  await assert.rejects(
    db.transaction((client) =>
      // no message row: every chunk breaks the foreign key
      copyChunks(client, inbox.inbox_id, 'msg_copy_orphan', pieces(data, 65_536), CHUNK_BYTES),
    ),
    /foreign key/,
  );
  // every connection of the pool still answers (none was left inside a COPY)
  const answers = await Promise.all(
    Array.from({ length: 12 }, () => db.rows('test-ping', 'SELECT 1 AS one', [])),
  );
  assert.deepEqual(
    answers,
    Array.from({ length: 12 }, () => [{ one: 1 }]),
  );
});

test('a connection lost early in a long, slow body fails the copy without reading the rest', async () => {
  const inbox = await h.provision();
  let produced = 0;
  async function* slow(): AsyncIterable<Buffer> {
    for (let i = 0; i < 100; i++) {
      await new Promise((resolve) => setTimeout(resolve, 10));
      produced++;
      yield Buffer.alloc(CHUNK_BYTES, i);
    }
  }
  await assert.rejects(
    db.transaction(async (client) => {
      const [row] = (await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows;
      await inFlight(client, inbox.inbox_id, 'msg_copy_lost');
      setTimeout(() => void db.rows('test-kill', 'SELECT pg_terminate_backend($1)', [row?.pid]), 100);
      return copyChunks(client, inbox.inbox_id, 'msg_copy_lost', slow(), CHUNK_BYTES);
    }),
  );
  assert.ok(produced < 100, `read ${produced} of 100 pieces before failing`);
});

test('a database error that came while the body was read ends a later wait for drain (no hang)', async () => {
  // pg-copy-streams reports a lost connection by emitting 'error' without destroying the stream; a
  // write then left buffered never drains. A client that never answers the COPY keeps the stream
  // corked (no CopyInResponse), so a chunk's write returns false and would wait for 'drain' forever.
  let copy: { handleError(error: Error): void; callback: () => void } | undefined;
  const silent = {
    query(query: typeof copy) {
      copy = query;
      if (copy) copy.callback = () => {};
      return query;
    },
  } as unknown as import('pg').PoolClient;
  async function* body(): AsyncIterable<Buffer> {
    copy?.handleError(new Error('Connection terminated unexpectedly'));
    yield Buffer.alloc(CHUNK_BYTES, 1);
  }
  const outcome = await Promise.race([
    copyChunks(silent, 'inbox', 'msg_never_drains', body(), CHUNK_BYTES).then(
      () => 'stored',
      (error: Error) => error.message,
    ),
    new Promise((resolve) => setTimeout(resolve, 2_000, 'still waiting after 2 s')),
  ]);
  assert.equal(outcome, 'Connection terminated unexpectedly');
});
