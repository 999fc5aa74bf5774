/**
 * The mail path's usage (inbox_used_bytes, which every reservation runs under the inbox's row lock)
 * reads only the inbox's overdue messages even on a connection that planned it while the messages
 * table was empty and that was never told of new statistics (no ANALYZE: a daemon started on a new
 * database, or a server with autovacuum off). Its generic plan once read every message of the inbox
 * through messages_undeleted (migrations 20261209000000 and 20261211000000 each rule that out;
 * key-plans.test.ts checks them one by one).
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import pg from 'pg';
import { type Harness, startHarness } from '../support/harness.ts';

const MESSAGES = 20_000;

let h: Harness;
let client: pg.Client;
before(async () => {
  h = await startHarness();
  client = new pg.Client({ connectionString: h.database.url });
  await client.connect();
  // What is planned here must not be replanned by an autovacuum ANALYZE that the inserts below would
  // set off on a server that runs it: this file's database is its own.
  await client.query('ALTER TABLE messages SET (autovacuum_enabled = off)');
  // As the daemons' pool plans (storage/database.ts).
  await client.query('SET plan_cache_mode = force_generic_plan');
});
after(async () => {
  await client.end();
  await h.close();
});

/** Shared buffers one call of inbox_used_bytes touches on this connection, with its result. */
async function usageCall(inboxId: string): Promise<{ buffers: number; used: number }> {
  const { rows } = await client.query<{ 'QUERY PLAN': [{ Plan: { 'Shared Hit Blocks': number } }] }>(
    `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
     SELECT inbox_used_bytes($1, held_bytes, now()) FROM inboxes WHERE inbox_id = $1`,
    [inboxId],
  );
  const used = await client.query<{ used: string }>(
    'SELECT inbox_used_bytes($1, held_bytes, now()) AS used FROM inboxes WHERE inbox_id = $1',
    [inboxId],
  );
  return {
    buffers: rows[0]?.['QUERY PLAN'][0].Plan['Shared Hit Blocks'] ?? Number.NaN,
    used: Number(used.rows[0]?.used),
  };
}

test('the overdue sum planned on an empty table still reads only the overdue messages once the inbox fills', async () => {
  const inboxId = (await h.provision()).inbox_id;
  const { rows } = await client.query<{ reltuples: number }>(
    "SELECT reltuples FROM pg_class WHERE relname = 'messages'",
  );
  assert.ok((rows[0]?.reltuples ?? 0) <= 0, 'the statistics say the table is empty');
  // Planned generically at once, as the pool does, and kept for the session.
  for (let i = 0; i < 10; i++) assert.equal((await usageCall(inboxId)).used, 0);

  await client.query(
    `INSERT INTO messages (inbox_id, message_id, queue_id, state, size_bytes, envelope_from, reserved_at,
       received_at, position)
     SELECT $1, 'msg_' || g, 'Q' || g, 'stored', 1000, 'a@b.test', now(), now(), g
     FROM generate_series(1, $2::int) g`,
    [inboxId, MESSAGES],
  );
  // One overdue message: the sum must still find it.
  await client.query(
    `UPDATE messages SET delete_after = now() - interval '1 minute' WHERE inbox_id = $1 AND message_id = 'msg_7'`,
    [inboxId],
  );
  const filled = await usageCall(inboxId);
  assert.equal(filled.used, (MESSAGES - 1) * 1000);
  // Read through messages_overdue: a few index and heap pages. Through messages_undeleted it was every
  // one of the inbox's messages, about 270 pages here.
  assert.ok(filled.buffers < 20, `${filled.buffers} shared buffers for one usage read`);
});
