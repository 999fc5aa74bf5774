/**
 * DESIGN decision 4, "two concurrent deliveries can never overfill an inbox", across processes: each
 * MessageStore below has its own pool, as each milter process has, so their reservations into one inbox
 * meet only in PostgreSQL (one process's per-inbox batcher already puts its own in a row, which is why
 * the end-to-end test with one milter could not see the row lock of reserve_messages go).
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import type { DependencyContainer } from 'tsyringe';
import { buildContainer, TOKENS } from '../../src/container.ts';
import { newMessageId } from '../../src/core/ids.ts';
import type { MessageStore } from '../../src/core/ports.ts';
import type { Database } from '../../src/storage/database.ts';
import { type Harness, startHarness } from '../support/harness.ts';

const QUOTA = 1_000;
const SIZE = 300;
const PROCESSES = 8;

let h: Harness;
let processes: DependencyContainer[];
before(async () => {
  h = await startHarness({ QUOTA_BYTES: String(QUOTA) });
  processes = Array.from({ length: PROCESSES }, () =>
    buildContainer(h.config, { clock: h.clock, log: () => {}, poolSize: 2 }),
  );
});
after(async () => {
  for (const p of processes ?? []) await p.resolve<Database>(TOKENS.Database).close();
  await h.close();
});

test('reservations from eight processes into one inbox at once: exactly as many as fit', async () => {
  for (let round = 0; round < 10; round++) {
    const inbox = await h.provision();
    const outcomes = await Promise.all(
      processes.map((p, i) =>
        p.resolve<MessageStore>(TOKENS.MessageStore).reserveAll([
          {
            inboxId: inbox.inbox_id,
            messageId: newMessageId(),
            queueId: `RACE${round}X${i}`,
            sizeBytes: SIZE,
            envelopeFrom: 'race@example.com',
            now: h.clock.now(),
          },
        ]),
      ),
    );
    const reserved = outcomes.filter((o) => o.kind === 'reserved').length;
    assert.equal(reserved, Math.floor(QUOTA / SIZE), `round ${round}`);
    const status = await h.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.owner });
    assert.equal(status.json.quota_used_bytes, reserved * SIZE, `round ${round}`);
  }
});

test('a store that made its own message row (no reservation) does not hold back reservations into its inbox while it streams', async () => {
  const inbox = await h.provision();
  const db = h.container.resolve<Database>(TOKENS.Database);
  const store = await db.pool.connect();
  try {
    // begin_delivery inserts the row itself: the foreign key holds KEY SHARE on the inbox row until
    // the store commits, which for a streamed message lasts while its bytes arrive.
    await store.query('BEGIN');
    await store.query(`SELECT * FROM begin_delivery($1, $2, 'QOWNROW1', 's@example.test', now())`, [
      inbox.inbox_id,
      newMessageId(),
    ]);
    const reserving = h.messages.reserve({
      inboxId: inbox.inbox_id,
      messageId: newMessageId(),
      queueId: 'QOWNROW2',
      sizeBytes: SIZE,
      envelopeFrom: 's@example.test',
      now: h.clock.now(),
    });
    // It returns while the store is still open; a reservation that waited for the store's lock would be
    // a session the store blocks (pg_blocking_pids, from the lock table).
    let settled = false;
    reserving.then(
      () => (settled = true),
      () => (settled = true),
    );
    const storePid = (await store.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]?.pid;
    while (!settled) {
      const blocked = await db.pool.query<{ n: number }>(
        'SELECT count(*)::int AS n FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))',
        [storePid],
      );
      assert.equal(blocked.rows[0]?.n, 0, 'the reservation waits for the store');
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    assert.equal(await reserving, 'reserved');
  } finally {
    await store.query('ROLLBACK');
    store.release();
  }
});
