/**
 * Cancelling an inbox takes its messages' rows before the inbox row (src/storage/inbox-store.ts
 * cancel), the order a store takes them in: a cancel racing a store waits for it instead of
 * deadlocking, and the stored message is deleted with the rest. A row made after the cancel took its
 * rows, and held by its store, is skipped: that store deletes it once it sees the inbox cancelled.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import type pg from 'pg';
import { TOKENS } from '../../src/container.ts';
import type { Database } from '../../src/storage/database.ts';
import { PgInboxStore } from '../../src/storage/inbox-store.ts';
import { type Harness, startHarness } from '../support/harness.ts';

let h: Harness;
let db: Database;

/** The backend's pid of a pooled client. */
const pidOf = async (client: pg.PoolClient): Promise<number> =>
  Number((await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]?.pid);

/** How many sessions `pid` blocks, from the lock table (pg_blocking_pids: exact, never a stale wait). */
const blockedBy = async (pid: number): Promise<number> =>
  Number(
    (
      await db.rows<{ n: number }>(
        'test-cancel-blocked-by',
        'SELECT count(*)::int AS n FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))',
        [pid],
      )
    )[0]?.n,
  );

/** Waits until `pid` blocks another session (or `done()`); fails with `what` after 5 s. */
async function blocking(pid: number, what: string, done: () => boolean = () => false): Promise<void> {
  for (let waited = 0; !done() && (await blockedBy(pid)) === 0; waited += 20) {
    assert.ok(waited < 5000, what);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

before(async () => {
  h = await startHarness();
  db = h.container.resolve<Database>(TOKENS.Database);
});
after(() => h.close());

test('a cancel racing a store waits for it, then deletes its message: no deadlock', async () => {
  const inbox = await h.provision();
  const store = await db.pool.connect();
  try {
    const storePid = await pidOf(store);
    // A reserved message (the milter's step), then its store, stopped between its two halves: it
    // holds its message's row, not yet the inbox row.
    await db.rows(
      'test-cancel-reserve',
      `SELECT reserve_messages(ARRAY[$1], ARRAY['msg_cancel_race'], 'QCANCEL1', ARRAY[4::int8], 's@example.test', now())`,
      [inbox.inbox_id],
    );
    await store.query('BEGIN');
    const begun = await store.query<{ out_message_id: string }>(
      `SELECT out_message_id FROM begin_delivery($1, 'msg_cancel_race', 'QCANCEL1', 's@example.test', now())`,
      [inbox.inbox_id],
    );
    const messageId = begun.rows[0]?.out_message_id;
    await store.query(
      `INSERT INTO message_chunks (inbox_id, message_id, seq, data) VALUES ($1, $2, 0, 'body')`,
      [inbox.inbox_id, messageId],
    );

    const cancelled = new PgInboxStore(db).cancel(inbox.inbox_id, new Date());
    await blocking(storePid, 'the cancel never waited for the store');
    // The store's second half takes the inbox row; with the cancel holding it, this would deadlock.
    await store.query(
      `SELECT finish_delivery($1, $2, 4, 262144, NULL, NULL, NULL, NULL, NULL, NULL, now())`,
      [inbox.inbox_id, messageId],
    );
    await store.query('COMMIT');

    assert.ok(await cancelled, 'the cancel went through');
    const rows = await db.rows<{ state: string; chunks: number }>(
      'test-cancel-after',
      `SELECT m.state, (SELECT count(*)::int FROM message_chunks c WHERE c.inbox_id = m.inbox_id) AS chunks
       FROM messages m WHERE m.inbox_id = $1`,
      [inbox.inbox_id],
    );
    assert.deepEqual(rows, [{ state: 'deleted', chunks: 0 }]);
  } finally {
    store.release();
  }
});

test('a reservation committed while a cancel waits for a row, whose store begins meanwhile, is left to that store: no deadlock', async () => {
  const inbox = await h.provision();
  await h.deliver(inbox.inbox_id, 'Subject: first\r\n\r\nfirst\r\n');
  const holder = await db.pool.connect();
  const store = await db.pool.connect();
  try {
    const holderPid = await pidOf(holder);
    const storePid = await pidOf(store);
    // A download or a job holds the stored message's row: the cancel's first step waits for it.
    await holder.query('BEGIN');
    await holder.query('SELECT 1 FROM messages WHERE inbox_id = $1 FOR UPDATE', [inbox.inbox_id]);
    let settled = false;
    const cancelled = new PgInboxStore(db).cancel(inbox.inbox_id, new Date());
    cancelled.then(
      () => (settled = true),
      () => (settled = true),
    );
    await blocking(holderPid, 'the cancel never waited');
    // Meanwhile a message is reserved (the inbox row is free) and its store begins: it holds its row.
    await db.rows(
      'test-cancel-reserve-late',
      `SELECT reserve_messages(ARRAY[$1], ARRAY['msg_cancel_late'], 'QCANCEL2', ARRAY[4::int8], 's@example.test', now())`,
      [inbox.inbox_id],
    );
    await store.query('BEGIN');
    await store.query(
      `SELECT out_message_id FROM begin_delivery($1, 'msg_cancel_late', 'QCANCEL2', 's@example.test', now())`,
      [inbox.inbox_id],
    );
    await store.query(
      `INSERT INTO message_chunks (inbox_id, message_id, seq, data) VALUES ($1, 'msg_cancel_late', 0, 'body')`,
      [inbox.inbox_id],
    );
    // The cancel goes on: it takes the inbox row, and must not wait for the store's message row.
    await holder.query('COMMIT');
    // Done, or (without the skip) waiting for the store's row: either way before the store goes on.
    await blocking(storePid, 'the cancel neither finished nor waited for the store', () => settled);
    // The store's second half takes the inbox row: it finds the inbox cancelled and keeps nothing.
    const finished = await store.query<{ kind: string }>(
      `SELECT finish_delivery_outcome($1, 'msg_cancel_late', 4, 262144, NULL, NULL, NULL, NULL, NULL, NULL, now()) AS kind`,
      [inbox.inbox_id],
    );
    await store.query('COMMIT');

    assert.ok(await cancelled, 'the cancel went through');
    assert.equal(finished.rows[0]?.kind, 'cancelled');
    const rows = await db.rows<{ state: string }>(
      'test-cancel-late-after',
      'SELECT state FROM messages WHERE inbox_id = $1',
      [inbox.inbox_id],
    );
    assert.deepEqual(
      rows.map((r) => r.state),
      ['deleted', 'deleted'],
    );
    const chunks = await db.rows<{ n: number }>(
      'test-cancel-late-chunks',
      'SELECT count(*)::int AS n FROM message_chunks WHERE inbox_id = $1',
      [inbox.inbox_id],
    );
    assert.equal(chunks[0]?.n, 0);
  } finally {
    await holder.query('ROLLBACK').catch(() => {});
    await store.query('ROLLBACK').catch(() => {});
    holder.release();
    store.release();
  }
});

test('a message stored while a cancel waits, and held by a mark when the cancel skips it, is deleted right after the cancel', async () => {
  const inbox = await h.provision();
  await h.deliver(inbox.inbox_id, 'Subject: first\r\n\r\nfirst\r\n');
  const holder = await db.pool.connect();
  const marker = await db.pool.connect();
  try {
    const holderPid = await pidOf(holder);
    const markerPid = await pidOf(marker);
    await holder.query('BEGIN');
    await holder.query('SELECT 1 FROM messages WHERE inbox_id = $1 FOR UPDATE', [inbox.inbox_id]);
    const cancelled = new PgInboxStore(db).cancel(inbox.inbox_id, new Date());
    await blocking(holderPid, 'the cancel never waited');
    // Stored meanwhile (the inbox row is free), then held as a download's mark holds it.
    const late = await h.deliver(inbox.inbox_id, 'Subject: late\r\n\r\nlate\r\n');
    await marker.query('BEGIN');
    await marker.query('SELECT 1 FROM messages WHERE inbox_id = $1 AND message_id = $2 FOR UPDATE', [
      inbox.inbox_id,
      late,
    ]);
    await holder.query('COMMIT');
    // The cancel skips the held row, commits, then waits for it to delete it.
    await blocking(markerPid, 'the cancel never came back for the held message');
    await marker.query('COMMIT');
    assert.ok(await cancelled, 'the cancel went through');
    const rows = await db.rows<{ state: string; chunks: number }>(
      'test-cancel-late-stored',
      `SELECT m.state, (SELECT count(*)::int FROM message_chunks c
         WHERE c.inbox_id = m.inbox_id AND c.message_id = m.message_id) AS chunks
       FROM messages m WHERE m.inbox_id = $1 ORDER BY m.message_id`,
      [inbox.inbox_id],
    );
    assert.deepEqual(
      rows.map((r) => [r.state, r.chunks]),
      [
        ['deleted', 0],
        ['deleted', 0],
      ],
    );
  } finally {
    await holder.query('ROLLBACK').catch(() => {});
    await marker.query('ROLLBACK').catch(() => {});
    holder.release();
    marker.release();
  }
});
