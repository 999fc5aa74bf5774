/**
 * Lookups of one message by its key plan the primary key even on a new table whose statistics say it is
 * empty (migrations/20261124000000_queue_id_first.ts): the foreign-key check every message_chunks insert
 * makes and finish_delivery's UPDATE run as cached generic plans, and with the unique index on
 * (inbox_id, queue_id) they walked every message of the inbox instead. The other way round, the
 * lookups of a delivery's row by its queue id (reserve_messages, begin_delivery) cannot use the primary
 * key at all (migrations/20261210000000_queue_id_lookups_fenced.ts), nor can the reservation's overdue
 * sum use the primary key or messages_undeleted (migrations/20261209000000_overdue_index_own_key.ts),
 * nor any statement that asks for an inbox by inbox_id take messages_undeleted (20261211000000):
 * where those cost the same as the right index, some connections kept them and walked the inbox on
 * every call. test/storage/usage-plans.test.ts shows the overdue sum's cost after the inbox fills.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import type pg from 'pg';
import { TOKENS } from '../../src/container.ts';
import type { Database } from '../../src/storage/database.ts';
import { LIST_EVENTS_SQL } from '../../src/storage/message-store.ts';
import { deployedSql, overdueSum } from '../support/deployed-sql.ts';
import { type Harness, startHarness } from '../support/harness.ts';
import { deliverMany } from '../support/jobs.ts';

let h: Harness;
let inboxId: string;
before(async () => {
  h = await startHarness();
  // The statistics must stay those of an empty table: no autovacuum ANALYZE on a server that runs it
  // (this file's database is its own).
  await h.container
    .resolve<Database>(TOKENS.Database)
    .pool.query('ALTER TABLE messages SET (autovacuum_enabled = off)');
  inboxId = (await h.provision()).inbox_id;
  // A few hundred rows, no ANALYZE: the planner still has the empty table's statistics.
  await deliverMany(h, [inboxId], 300, (i) => `Subject: ${i}\r\n\r\n${i}\r\n`);
});
after(() => h.close());

/** A condition as deployed (support/deployed-sql.ts). */
const deployedCondition = (fn: string, pattern: RegExp, params: [string, string][]) =>
  deployedSql(h.container.resolve<Database>(TOKENS.Database), fn, pattern, params);

/**
 * The generic plan of `sql` with `indexes` out of the planner's reach and sequential scans priced out,
 * in a transaction rolled back: what is left is whatever else could serve the condition.
 */
async function planWithout(indexes: string[], sql: string, types: string[], literals: string[]) {
  return h.container.resolve<Database>(TOKENS.Database).withClient(async (client: pg.PoolClient) => {
    let prepared = false;
    await client.query('BEGIN');
    try {
      await client.query('UPDATE pg_index SET indisvalid = false WHERE indexrelid = ANY($1::regclass[])', [
        indexes,
      ]);
      await client.query('SET LOCAL enable_seqscan = off');
      await client.query('SET LOCAL plan_cache_mode = force_generic_plan');
      await client.query(`PREPARE fenced_probe (${types.join(', ')}) AS ${sql}`);
      prepared = true;
      const values = literals.map((v) => `'${v}'`).join(', ');
      const explained = await client.query(`EXPLAIN EXECUTE fenced_probe (${values})`);
      return explained.rows.map((r: Record<string, string>) => r['QUERY PLAN']).join('\n');
    } finally {
      await client.query('ROLLBACK');
      // A prepared statement outlives the rollback.
      if (prepared) await client.query('DEALLOCATE fenced_probe');
    }
  });
}

const RESERVE_LOOKUP = /EXISTS \(SELECT 1 FROM messages WHERE ([^\n]*)\)\s*THEN 'exists'/;
const BEGIN_LOOKUP = /FROM messages m\s+WHERE ([^;]*?) FOR UPDATE;/;
/** The PL/pgSQL variables of the two lookups: $1 the queue id, $2 the inbox (p_inbox_ids[i] first). */
const LOOKUP_PARAMS: [string, string][] = [
  ['p_queue_id', '$1'],
  ['p_inbox_ids[i]', '$2'],
  ['p_inbox_id', '$2'],
];

for (const [fn, pattern] of [
  ['reserve_messages', RESERVE_LOOKUP],
  ['begin_delivery', BEGIN_LOOKUP],
] as const) {
  const condition = () => deployedCondition(fn, pattern, LOOKUP_PARAMS);

  test(`${fn}'s lookup by queue id cannot reach the inbox through the primary key`, async () => {
    const plan = await planWithout(
      ['messages_queue_id_inbox_id_key'],
      `SELECT 1 FROM messages m WHERE ${await condition()}`,
      ['text', 'text'],
      ['Q1', inboxId],
    );
    // The primary key could only take `inbox_id = $2`: the inbox's every message, its queue id a filter.
    assert.doesNotMatch(plan, /Index Cond: \(+inbox_id = /, plan);
  });

  test(`${fn}'s lookup by queue id plans the idempotency key's index`, async () => {
    const plan = await genericPlan(
      `SELECT 1 FROM messages m WHERE ${await condition()}`,
      ['text', 'text'],
      ['Q1', inboxId],
    );
    assert.match(
      plan,
      /using messages_queue_id_inbox_id_key[^\n]*\n\s+Index Cond: \(+queue_id = \$1\)/,
      plan,
    );
  });
}

test("inbox_used_bytes' overdue sum cannot reach the inbox through the primary key or messages_undeleted", async () => {
  // migrations/20261209000000_overdue_index_own_key.ts: only messages_overdue can serve it.
  const sum = await overdueSum(h.container.resolve<Database>(TOKENS.Database));
  const plan = await planWithout(
    ['messages_overdue'],
    sum,
    ['text', 'timestamptz'],
    [inboxId, new Date().toISOString()],
  );
  // The primary key cannot take its inbox condition (the inbox's every message), and
  // messages_undeleted cannot serve it at all, not even read whole.
  assert.doesNotMatch(plan, /messages_pkey[^\n]*\n\s+Index Cond: /, plan);
  assert.doesNotMatch(plan, /messages_undeleted/, plan);
});

test('messages_undeleted serves none of the statements that ask for an inbox by inbox_id', async () => {
  // migrations/20261211000000_undeleted_index_own_key.ts. The poll listing, with its own index hidden,
  // and a message's lookup in a state other than deleted (markDownloaded, recordLost), with the
  // primary key hidden: what is left must not be messages_undeleted.
  const listing = await planWithout(
    ['messages_position'],
    LIST_EVENTS_SQL,
    ['text', 'int8', 'int4', 'timestamptz', 'boolean', 'timestamptz'],
    [inboxId, '0', '50', new Date().toISOString(), 'true', new Date().toISOString()],
  );
  // Not even whole (ANDed into another scan, as a plan made after an ANALYZE of a small table did).
  assert.doesNotMatch(listing, /messages_undeleted/, listing);
  const byMessage = await planWithout(
    ['messages_pkey'],
    `SELECT 1 FROM messages WHERE inbox_id = $1 AND message_id = $2 AND state = 'stored'`,
    ['text', 'text'],
    [inboxId, 'msg_none'],
  );
  assert.doesNotMatch(byMessage, /messages_undeleted/, byMessage);
});

async function genericPlan(sql: string, types: string[], values: unknown[]): Promise<string> {
  return h.container.resolve<Database>(TOKENS.Database).withClient(async (client: pg.PoolClient) => {
    const { rows } = await client.query<{ reltuples: number }>(
      "SELECT reltuples FROM pg_class WHERE relname = 'messages'",
    );
    assert.ok((rows[0]?.reltuples ?? 0) <= 0, 'the statistics still say the table is empty');
    await client.query('SET plan_cache_mode = force_generic_plan');
    let prepared = false;
    try {
      await client.query(`PREPARE probe (${types.join(', ')}) AS ${sql}`);
      prepared = true;
      const literals = values.map((v) => `'${String(v)}'`);
      const explained = await client.query(`EXPLAIN EXECUTE probe (${literals.join(', ')})`);
      return explained.rows.map((r: Record<string, string>) => r['QUERY PLAN']).join('\n');
    } finally {
      try {
        if (prepared) await client.query('DEALLOCATE probe');
      } finally {
        await client.query('RESET plan_cache_mode');
      }
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
