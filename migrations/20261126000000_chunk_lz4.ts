/**
 * Message chunks are stored lz4-compressed (STORAGE EXTENDED, COMPRESSION lz4) instead of uncompressed
 * (STORAGE EXTERNAL). Chunks written before keep their form; Postgres reads both.
 *
 * Why: what arrives here is mostly text (HTML and plain-text bodies, headers), which lz4 shrinks several
 * times at a small CPU cost, and each stored byte costs Postgres a TOAST row per ~2 KB, a WAL record and
 * a later page write. DESIGN 7 ruled out pglz (about 16 ms/MiB on insert, reads 13 times slower) and
 * named lz4 as the alternative. Measured with test/bench/chunk-storage.ts (1 MiB messages through
 * copyChunks; Postgres backend CPU, WAL and stored bytes per MiB; uncompressed -> lz4):
 *   HTML text              4.8-5.0 -> 4.0 ms, WAL 1.07 -> 0.39 MiB, stored 1.04 -> 0.38 MiB
 *   base64 of random bytes 4.4-4.8 -> 4.2-4.3 ms, WAL and stored unchanged (lz4 gives up quickly)
 *   smtp-source's body     4.5-5.2 -> 1.8 ms, WAL and stored 0.01 MiB (mail-bench's content: "X" lines)
 * A chunk that does not compress is stored as it is.
 *
 * `octet_length(data)` (storedBytes) still reads the raw size from the value's header without
 * decompressing it.
 */
import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  await knex.raw(`
    ALTER TABLE message_chunks ALTER COLUMN data SET STORAGE EXTENDED,
      ALTER COLUMN data SET COMPRESSION lz4;
  `);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw(`
    ALTER TABLE message_chunks ALTER COLUMN data SET STORAGE EXTERNAL,
      ALTER COLUMN data SET COMPRESSION default;
  `);
}
