/**
 * copy-chunks - writes a streamed message's chunks with one binary `COPY message_chunks FROM STDIN`.
 *
 * Why COPY: a parameterized INSERT per chunk made node-postgres serialize each 256 KiB chunk into its
 * own growing writer (a copy of every byte, then garbage), after the chunk itself had been concatenated
 * (another copy). Here a chunk's pieces go to the socket as they came from the LMTP stream: only a
 * 14-byte field header per chunk is made, never a buffer the size of the data. One statement per message
 * instead of one per chunk, too.
 *
 * Binary format (PostgreSQL manual, "COPY", "Binary Format"): the 11-byte signature, 32-bit flags and
 * header-extension length (both 0); per tuple a 16-bit field count and, per field, a 32-bit length and
 * its bytes (text as UTF-8, integer as 4 bytes big-endian, bytea raw); a 16-bit -1 ends the data.
 *
 * Memory: at most one chunk's pieces wait here (they are written once the chunk is full, its length
 * being part of the tuple), plus what the socket has not taken (writes wait for 'drain').
 */
import { once } from 'node:events';
import { finished } from 'node:stream/promises';
import type pg from 'pg';
import { from as copyFrom } from 'pg-copy-streams';
import { COPY_SIGNATURE } from './copy-binary.ts';

const HEADER = Buffer.concat([COPY_SIGNATURE, Buffer.alloc(8)]);
const TRAILER = Buffer.from([0xff, 0xff]);
const COPY_SQL = 'COPY message_chunks (inbox_id, message_id, seq, data) FROM STDIN (FORMAT binary)';

/**
 * Cuts `body` into chunkBytes pieces (the last one shorter) as chunks 0, 1, ... of the message and
 * copies them in; resolves once Postgres has taken them all (inside the caller's transaction). If the
 * body fails, the COPY is cancelled (CopyFail) and the body's error is thrown; a database error is thrown
 * as it is. The body is consumed up to the failure.
 */
export async function copyChunks(
  client: pg.PoolClient,
  inboxId: string,
  messageId: string,
  body: AsyncIterable<Buffer>,
  chunkBytes: number,
): Promise<{ size: number }> {
  const copy = client.query(copyFrom(COPY_SQL));
  const settled = finished(copy);
  // A database error rejects `settled` while this still reads the body: it is handled below, after the
  // body, and must not count as unhandled meanwhile.
  settled.catch(() => undefined);
  const prefix = tuplePrefix(inboxId, messageId);
  let pending: Buffer[] = [];
  let filled = 0;
  let seq = 0;
  let size = 0;
  const write = async (bytes: Buffer) => {
    // A database error settles `settled`: one that came while this waits, or earlier, while the body
    // was read (pg-copy-streams then emits 'error' without destroying the stream, and a write left
    // pending on the lost connection would never drain), ends the wait with that error.
    if (!copy.write(bytes)) await Promise.race([once(copy, 'drain'), settled]);
  };
  const flush = async () => {
    const fieldHeads = Buffer.allocUnsafe(12);
    fieldHeads.writeInt32BE(4, 0);
    fieldHeads.writeInt32BE(seq++, 4);
    fieldHeads.writeInt32BE(filled, 8);
    await write(Buffer.concat([prefix, fieldHeads]));
    for (const piece of pending) await write(piece);
    pending = [];
    filled = 0;
  };
  try {
    await write(HEADER);
    for await (const piece of body) {
      size += piece.length;
      for (let offset = 0; offset < piece.length; ) {
        const take = Math.min(piece.length - offset, chunkBytes - filled);
        pending.push(offset === 0 && take === piece.length ? piece : piece.subarray(offset, offset + take));
        offset += take;
        filled += take;
        if (filled === chunkBytes) await flush();
      }
    }
    if (filled > 0) await flush();
  } catch (error) {
    // CopyFail: Postgres ends the COPY with an error, and the connection is ready for the ROLLBACK.
    if (!copy.destroyed) copy.destroy(error instanceof Error ? error : new Error(String(error)));
    await settled.catch(() => undefined);
    throw error;
  }
  copy.end(TRAILER);
  await settled;
  return { size };
}

/** A tuple's field count and its first two fields (inbox id, message id) as UTF-8 text. */
function tuplePrefix(inboxId: string, messageId: string): Buffer {
  const inbox = Buffer.from(inboxId, 'utf8');
  const message = Buffer.from(messageId, 'utf8');
  const prefix = Buffer.allocUnsafe(2 + 4 + inbox.length + 4 + message.length);
  let at = prefix.writeInt16BE(4, 0);
  at = prefix.writeInt32BE(inbox.length, at);
  at += inbox.copy(prefix, at);
  at = prefix.writeInt32BE(message.length, at);
  message.copy(prefix, at);
  return prefix;
}
