/**
 * The sweep indexes (migrations/20261122000000_sweep_indexes.ts) serve the sweeps and nothing else: with
 * a few thousand messages in every state and fresh statistics, the poll listing and the usage count,
 * planned generically as the pool plans them, still walk one inbox's own index entries (an earlier
 * partial index on delete_after made the listing scan 40k entries), and each sweep finds its rows
 * through its index rather than a scan of the table.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import type pg from 'pg';
import { TOKENS } from '../../src/container.ts';
import type { ProvisionedInbox } from '../../src/core/inbox-service.ts';
import type { Database } from '../../src/storage/database.ts';
import { LIST_EVENTS_SQL } from '../../src/storage/message-store.ts';
import { DELETE_DUE_PICK_SQL, EXPIRE_PICK_SQL, TOMBSTONE_PICK_SQL } from '../../src/storage/sweeper-store.ts';
import { USAGE_WHERE } from '../../src/storage/usage.ts';
import { overdueSum } from '../support/deployed-sql.ts';
import { type Harness, startHarness } from '../support/harness.ts';
import { deliverMany, testJobs } from '../support/jobs.ts';

let h: Harness;
let busiest: ProvisionedInbox;
before(async () => {
  h = await startHarness({ POLL_RATE_BURST: '100000', DOWNLOAD_RATE_BURST: '100000' });
  const inboxes: ProvisionedInbox[] = [];
  for (let i = 0; i < 60; i++) inboxes.push(await h.provision());
  busiest = inboxes[0] as ProvisionedInbox;
  await deliverMany(
    h,
    inboxes.map((i) => i.inbox_id),
    3000,
    (i) => `Subject: ${i}\r\n\r\nmessage ${i}\r\n`,
  );
  // Most are listed (delete_after set), some downloaded, some already deleted by their timer.
  for (const inbox of inboxes.slice(0, 45)) {
    const body = (
      await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages?limit=200`, {
        token: inbox.credentials.reader,
      })
    ).json;
    for (const m of body.messages.slice(0, 10)) await h.api.get(m.url, { token: inbox.credentials.reader });
  }
  h.clock.advance(h.config.downloadGraceSeconds);
  await testJobs(h).run('delete-messages');
  await h.container.resolve<Database>(TOKENS.Database).pool.query('ANALYZE');
});
after(() => h.close());

/** The plan of `sql` with `values`, planned as the pool plans (generic) or for its values (custom). */
async function plan(sql: string, types: string[], values: unknown[], mode: 'generic' | 'custom') {
  return h.container.resolve<Database>(TOKENS.Database).withClient(async (client: pg.PoolClient) => {
    await client.query(`SET plan_cache_mode = force_${mode}_plan`);
    try {
      await client.query(`PREPARE probe (${types.join(', ')}) AS ${sql}`);
      const literals = values.map((v) => (v instanceof Date ? `'${v.toISOString()}'` : JSON.stringify(v)));
      const explained = await client.query(
        `EXPLAIN EXECUTE probe (${literals.join(', ')})`.replaceAll('"', "'"),
      );
      return explained.rows.map((r: Record<string, string>) => r['QUERY PLAN']).join('\n');
    } finally {
      await client.query('DEALLOCATE probe');
      await client.query('SET plan_cache_mode = force_generic_plan');
    }
  });
}

test('the poll listing still walks messages_position for its inbox, not a sweep index', async () => {
  const now = h.clock.now();
  const listing = await plan(
    LIST_EVENTS_SQL,
    ['text', 'int8', 'int8', 'timestamptz', 'boolean', 'timestamptz'],
    [busiest.inbox_id, 0, 51, now, true, new Date(now.getTime() - 3_600_000)],
    'generic',
  );
  assert.match(listing, /Index Scan using messages_position on messages m/, listing);
  assert.doesNotMatch(
    listing,
    /messages_delete_due|messages_deleted_at|messages_overdue|messages_undeleted|Seq Scan on messages/,
    listing,
  );
});

test('the usage count still reads one inbox through its own key', async () => {
  const usage = await plan(
    `SELECT count(*), coalesce(sum(size_bytes), 0) FROM messages WHERE ${USAGE_WHERE('$1', '$2')}`,
    ['text', 'timestamptz'],
    [busiest.inbox_id, h.clock.now()],
    'generic',
  );
  assert.match(usage, /Index Cond: \(inbox_id = \$1\)/, usage);
  assert.doesNotMatch(
    usage,
    /messages_delete_due|messages_deleted_at|messages_overdue|messages_undeleted|Seq Scan on messages/,
    usage,
  );
});

test('delete-messages and drop-tombstones find their rows through their indexes', async () => {
  const now = h.clock.now();
  // The job's own statement (until 2026-11-25 a copy of it written here).
  const due = await plan(DELETE_DUE_PICK_SQL, ['timestamptz', 'int4'], [now, 500], 'custom');
  assert.match(due, /messages_delete_due/, due);
  // The job's own statement: until migration 20261206000000 its reserved_at condition made it read the
  // whole table.
  const tombstones = await plan(
    TOMBSTONE_PICK_SQL,
    ['timestamptz', 'timestamptz', 'timestamptz', 'int4'],
    [
      new Date(now.getTime() - h.config.goneSeconds * 1000),
      new Date(now.getTime() - h.config.reservationTtlSeconds * 1000),
      now,
      500,
    ],
    'custom',
  );
  assert.match(tombstones, /messages_tombstone_horizon/, tombstones);
  assert.doesNotMatch(tombstones, /Seq Scan on messages/, tombstones);
});

test('expire-inboxes reaches messages through the expired inboxes, never by scanning the messages table', async () => {
  // Every inbox counted as expired: the pick must still walk each one's own key.
  for (const mode of ['custom', 'generic'] as const) {
    const pick = await plan(
      EXPIRE_PICK_SQL,
      ['timestamptz', 'int4'],
      [new Date(Date.UTC(2100, 0)), 500],
      mode,
    );
    assert.match(
      pick,
      /Index Scan (?:using|on) messages_undeleted[^\n]*\n\s+Index Cond: \(\(''::text \|\| inbox_id\) = i\.inbox_id\)/,
      pick,
    );
    assert.doesNotMatch(pick, /Seq Scan on messages/, pick);
  }
});

test("the mail path's usage reads only the inbox's overdue messages, through messages_overdue", async () => {
  // The query inside inbox_used_bytes as deployed (migrations/20261209000000_overdue_index_own_key.ts).
  const query = await overdueSum(h.container.resolve<Database>(TOKENS.Database));
  const overdue = await plan(query, ['text', 'timestamptz'], [busiest.inbox_id, h.clock.now()], 'generic');
  assert.match(overdue, /Index Scan (using|on) messages_overdue/, overdue);
  assert.match(
    overdue,
    /Index Cond: \(\(\(inbox_id \|\| ''::text\) = \$1\) AND \(delete_after <= \$2\)\)/,
    overdue,
  );
});
