/**
 * The mail path's per-inbox batches against real Postgres (src/storage/store-batch.ts,
 * reserve-batch.ts, migration 20261127000000): stores and reservations for one inbox made while one is
 * in flight share a statement, and each comes out as it would alone: bytes and digest exact, event
 * positions in arrival order, idempotent on the queue id within a batch, quota counted across the
 * batch, and a message Postgres refuses failing alone.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, test } from 'node:test';
import { TOKENS } from '../../src/container.ts';
import type { Reservation } from '../../src/core/ports.ts';
import type { Database } from '../../src/storage/database.ts';
import { CHUNK_BYTES } from '../../src/storage/message-store.ts';
import { singleInboxReservations } from '../../src/storage/reserve-batch.ts';
import { type WholeMessage, wholeMessageStores } from '../../src/storage/store-batch.ts';
import { type Harness, startHarness } from '../support/harness.ts';

let h: Harness;
let db: Database;
before(async () => {
  h = await startHarness();
  db = h.container.resolve<Database>(TOKENS.Database);
});
after(() => h.close());

let serial = 0;
function message(inboxId: string, data: Buffer, overrides: Partial<WholeMessage> = {}): WholeMessage {
  serial++;
  return {
    inboxId,
    newMessageId: `msg_batch_${serial}`,
    queueId: `QB${serial}`,
    envelopeFrom: `sender${serial}@example.test`,
    now: new Date().toISOString(),
    data,
    chunkBytes: CHUNK_BYTES,
    fromName: `Sender ${serial}`,
    fromAddress: `sender${serial}@example.test`,
    subject: `Subject ${serial}`,
    internetMessageId: `<${serial}@example.test>`,
    authentication: JSON.stringify({ dkim: { result: 'none' } }),
    ...overrides,
  };
}

interface StoredRow {
  message_id: string;
  queue_id: string;
  position: number;
  size_bytes: number;
  sha256: Buffer | null;
  subject: string | null;
  from_name: string | null;
  authentication: unknown;
  envelope_from: string;
  data: Buffer;
}

async function storedRows(inboxId: string): Promise<StoredRow[]> {
  return db.rows<StoredRow>(
    'test-batch-rows',
    `SELECT m.message_id, m.queue_id, m.position, m.size_bytes, m.sha256, m.subject, m.from_name, m.authentication, m.envelope_from,
            c.data
     FROM messages m JOIN message_chunks c USING (inbox_id, message_id)
     WHERE m.inbox_id = $1 AND m.state = 'stored' ORDER BY m.position`,
    [inboxId],
  );
}

test('stores made while one is in flight share a statement; each is stored exact, positioned in arrival order', async () => {
  const inbox = await h.provision();
  const stores = wholeMessageStores(db);
  // The sixth has no summary at all: nulls in every array the batch sends.
  const noSummary = {
    fromName: null,
    fromAddress: null,
    subject: null,
    internetMessageId: null,
    authentication: null,
  };
  const messages = Array.from({ length: 12 }, (_, i) =>
    message(inbox.inbox_id, randomBytes(1000 + i * 7919), i === 5 ? noSummary : {}),
  );
  const outcomes = await Promise.all(messages.map((m) => stores.run(inbox.inbox_id, m)));

  assert.deepEqual(
    outcomes,
    messages.map((m) => ({ kind: 'stored', messageId: m.newMessageId })),
  );
  assert.equal(stores.counts.items, 12);
  assert.equal(stores.counts.statements, 2, 'the first alone, the eleven that waited for it together');
  const rows = await storedRows(inbox.inbox_id);
  assert.deepEqual(
    rows.map((r) => r.message_id),
    messages.map((m) => m.newMessageId),
  );
  rows.forEach((row, i) => {
    const sent = messages[i] as WholeMessage;
    assert.ok(row.data.equals(sent.data), `message ${i + 1}'s bytes`);
    assert.equal(row.size_bytes, sent.data.length);
    assert.equal(row.sha256, null, 'no content digest is computed');
    assert.equal(row.subject, sent.subject);
    assert.equal(row.from_name, sent.fromName);
    assert.deepEqual(
      row.authentication,
      sent.authentication === null ? null : JSON.parse(sent.authentication),
    );
    assert.equal(row.envelope_from, sent.envelopeFrom);
    assert.equal(row.queue_id, sent.queueId);
  });
  const positions = rows.map((r) => r.position);
  assert.deepEqual(
    positions,
    [...positions].sort((a, b) => a - b),
  );
  assert.equal(new Set(positions).size, 12);
});

test('the same queue id twice in one batch is stored once; both get its message id', async () => {
  const inbox = await h.provision();
  const stores = wholeMessageStores(db);
  const first = message(inbox.inbox_id, Buffer.from('first'));
  const data = Buffer.from('the message, delivered twice');
  const once = message(inbox.inbox_id, data);
  const again = { ...once, newMessageId: 'msg_batch_again' };
  const outcomes = await Promise.all([first, once, again].map((m) => stores.run(inbox.inbox_id, m)));

  assert.equal(stores.counts.statements, 2);
  assert.deepEqual(outcomes.slice(1), [
    { kind: 'stored', messageId: once.newMessageId },
    { kind: 'duplicate', messageId: once.newMessageId },
  ]);
  const rows = await storedRows(inbox.inbox_id);
  assert.equal(rows.filter((r) => r.queue_id === once.queueId).length, 1);
});

test('a message Postgres refuses fails alone: the rest of its batch is stored', async () => {
  const inbox = await h.provision();
  const stores = wholeMessageStores(db);
  const messages = [
    message(inbox.inbox_id, Buffer.from('one')),
    message(inbox.inbox_id, Buffer.from('two')),
    // A NUL cannot be stored in a text column: Postgres refuses the statement.
    message(inbox.inbox_id, Buffer.from('three'), { subject: 'bad \u0000 subject' }),
    message(inbox.inbox_id, Buffer.from('four')),
  ];
  const settled = await Promise.allSettled(messages.map((m) => stores.run(inbox.inbox_id, m)));

  assert.deepEqual(
    settled.map((s) => s.status),
    ['fulfilled', 'fulfilled', 'rejected', 'fulfilled'],
  );
  const rows = await storedRows(inbox.inbox_id);
  assert.deepEqual(
    rows.map((r) => r.data.toString()),
    ['one', 'two', 'four'],
  );
  // One alone, the failed batch of three, then its three on their own.
  assert.equal(stores.counts.statements, 5);
});

test('stores for two inboxes run side by side, each batched on its own', async () => {
  const a = await h.provision();
  const b = await h.provision();
  const stores = wholeMessageStores(db);
  const messages = Array.from({ length: 8 }, (_, i) =>
    message(i % 2 ? b.inbox_id : a.inbox_id, Buffer.from(`message ${i}`)),
  );
  await Promise.all(messages.map((m) => stores.run(m.inboxId, m)));

  assert.equal(stores.counts.statements, 4, 'per inbox: one alone, three together');
  assert.deepEqual(
    (await storedRows(a.inbox_id)).map((r) => r.data.toString()),
    ['message 0', 'message 2', 'message 4', 'message 6'],
  );
  assert.deepEqual(
    (await storedRows(b.inbox_id)).map((r) => r.data.toString()),
    ['message 1', 'message 3', 'message 5', 'message 7'],
  );
});

test('reservations in one batch count each other against the quota, in arrival order', async () => {
  const inbox = await h.provision();
  await db.rows('test-quota', 'UPDATE inboxes SET quota_bytes = 3000 WHERE inbox_id = $1', [inbox.inbox_id]);
  const reservations = singleInboxReservations(db);
  const now = new Date();
  const reservation = (i: number, sizeBytes: number): Reservation => ({
    inboxId: inbox.inbox_id,
    messageId: `msg_reserve_${serial}_${i}`,
    queueId: `QR${serial}x${i}`,
    sizeBytes,
    envelopeFrom: 'sender@example.test',
    now,
  });
  serial++;
  const batch = [1000, 1500, 1000, 400, 600].map((size, i) => reservation(i, size));
  const outcomes = await Promise.all(batch.map((r) => reservations.run(inbox.inbox_id, r)));

  assert.deepEqual(outcomes, ['reserved', 'reserved', 'over_quota', 'reserved', 'over_quota']);
  assert.equal(reservations.counts.statements, 2);
  const [row] = await db.rows<{ held_bytes: number; in_flight: number }>(
    'test-held',
    `SELECT i.held_bytes, (SELECT count(*)::int FROM messages m WHERE m.inbox_id = i.inbox_id AND m.state = 'in_flight') AS in_flight
     FROM inboxes i WHERE i.inbox_id = $1`,
    [inbox.inbox_id],
  );
  assert.deepEqual(row, { held_bytes: 2900, in_flight: 3 });

  // A queue id already reserved is 'exists', in a batch too.
  const [, , repeated] = await Promise.all([
    reservations.run(inbox.inbox_id, reservation(8, 10)),
    reservations.run(inbox.inbox_id, reservation(9, 10)),
    reservations.run(inbox.inbox_id, { ...(batch[0] as Reservation), messageId: 'msg_reserve_again' }),
  ]);
  assert.equal(repeated, 'exists');
  assert.equal(reservations.counts.statements, 4);
});

test("a batch takes its messages' rows before the inbox row, as a job or the API does: no deadlock with them", async () => {
  const inbox = await h.provision();
  const reservations = singleInboxReservations(db);
  const stores = wholeMessageStores(db);
  const [first, second, third] = [1, 2, 3].map(() => message(inbox.inbox_id, Buffer.from(`body ${serial}`)));
  for (const m of [second, third] as WholeMessage[]) {
    const reservation = { ...m, messageId: m.newMessageId, sizeBytes: 100, now: new Date(m.now) };
    assert.equal(await reservations.run(inbox.inbox_id, reservation), 'reserved');
  }
  // Another transaction holds the third message's row, as the jobs and the API's marks do before they
  // touch the inbox row.
  const other = await db.pool.connect();
  try {
    await other.query('BEGIN');
    await other.query('SELECT 1 FROM messages WHERE inbox_id = $1 AND queue_id = $2 FOR UPDATE', [
      inbox.inbox_id,
      third?.queueId,
    ]);
    // The first store holds the lane; the second and third go together, and wait for the third's row.
    const stored = Promise.all(
      [first, second, third].map((m) => stores.run(inbox.inbox_id, m as WholeMessage)),
    );
    for (let waited = 0; ; waited += 20) {
      const [row] = await db.rows<{ n: number }>(
        'test-batch-waiting',
        `SELECT count(*)::int AS n FROM pg_stat_activity
         WHERE wait_event_type = 'Lock' AND query LIKE '%store_whole_messages%'`,
        [],
      );
      if (row?.n === 1) break;
      assert.ok(waited < 5000, 'the batch never waited for the row');
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    await other.query('UPDATE inboxes SET version = version + 1 WHERE inbox_id = $1', [inbox.inbox_id]);
    await other.query('COMMIT');

    assert.deepEqual(
      (await stored).map((o) => o.kind),
      ['stored', 'stored', 'stored'],
    );
    assert.equal(
      stores.counts.statements,
      2,
      'the batch went through as one statement, not aborted and retried',
    );
  } finally {
    other.release();
  }
});
