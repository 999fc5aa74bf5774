/**
 * Cancelling an inbox takes its messages' rows before the inbox row (src/storage/inbox-store.ts
 * cancel), the order a store takes them in: a cancel racing a store waits for it instead of
 * deadlocking, and the stored message is deleted with the rest.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { TOKENS } from '../../src/container.ts';
import type { Database } from '../../src/storage/database.ts';
import { PgInboxStore } from '../../src/storage/inbox-store.ts';
import { type Harness, startHarness } from '../support/harness.ts';

let h: Harness;
let db: Database;
before(async () => {
  h = await startHarness();
  db = h.container.resolve<Database>(TOKENS.Database);
});
after(() => h.close());

test('a cancel racing a store waits for it, then deletes its message: no deadlock', async () => {
  const inbox = await h.provision();
  const store = await db.pool.connect();
  try {
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
    for (let waited = 0; ; waited += 20) {
      const [row] = await db.rows<{ n: number }>(
        'test-cancel-waiting',
        `SELECT count(*)::int AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`,
        [],
      );
      if (row?.n === 1) break;
      assert.ok(waited < 5000, 'the cancel never waited for the store');
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
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
