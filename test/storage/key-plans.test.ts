/**
 * Lookups of one message by its key plan the primary key even on a new table whose statistics say it is
 * empty (migrations/20261124000000_queue_id_first.ts): the foreign-key check every message_chunks insert
 * makes and finish_delivery's UPDATE run as cached generic plans, and with the unique index on
 * (inbox_id, queue_id) they walked every message of the inbox instead.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import type pg from 'pg';
import { TOKENS } from '../../src/container.ts';
import type { Database } from '../../src/storage/database.ts';
import { type Harness, startHarness } from '../support/harness.ts';
import { deliverMany } from '../support/jobs.ts';

let h: Harness;
let inboxId: string;
before(async () => {
  h = await startHarness();
  inboxId = (await h.provision()).inbox_id;
  // A few hundred rows, no ANALYZE: the planner still has the empty table's statistics.
  await deliverMany(h, [inboxId], 300, (i) => `Subject: ${i}\r\n\r\n${i}\r\n`);
});
after(() => h.close());

async function genericPlan(sql: string, types: string[], values: unknown[]): Promise<string> {
  return h.container.resolve<Database>(TOKENS.Database).withClient(async (client: pg.PoolClient) => {
    const { rows } = await client.query<{ reltuples: number }>(
      "SELECT reltuples FROM pg_class WHERE relname = 'messages'",
    );
    assert.ok((rows[0]?.reltuples ?? 0) <= 0, 'the statistics still say the table is empty');
    await client.query('SET plan_cache_mode = force_generic_plan');
    try {
      await client.query(`PREPARE probe (${types.join(', ')}) AS ${sql}`);
      const literals = values.map((v) => `'${String(v)}'`);
      const explained = await client.query(`EXPLAIN EXECUTE probe (${literals.join(', ')})`);
      return explained.rows.map((r: Record<string, string>) => r['QUERY PLAN']).join('\n');
    } finally {
      await client.query('DEALLOCATE probe');
      await client.query('RESET plan_cache_mode');
    }
  });
}

const byKey =
  /Index (Only )?Scan using messages_pkey on messages[^\n]*\n\s+Index Cond: \(\(inbox_id = \$1\) AND \(message_id = \$2\)\)/;

test("the chunk insert's foreign-key check finds the message by its primary key", async () => {
  const plan = await genericPlan(
    // The statement Postgres's RI trigger runs for message_chunks_inbox_id_message_id_fkey.
    'SELECT 1 FROM ONLY messages x WHERE inbox_id = $1 AND message_id = $2 FOR KEY SHARE OF x',
    ['text', 'text'],
    [inboxId, 'msg_none'],
  );
  assert.match(plan, byKey, plan);
});

test("finish_delivery's update finds the message by its primary key", async () => {
  const plan = await genericPlan(
    "UPDATE messages m SET state = 'stored' WHERE m.inbox_id = $1 AND m.message_id = $2",
    ['text', 'text'],
    [inboxId, 'msg_none'],
  );
  assert.match(plan, byKey, plan);
});
