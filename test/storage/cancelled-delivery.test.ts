/**
 * A delivery that completes after its inbox was cancelled keeps nothing. With its reservation still
 * there, the cancel already made it a tombstone and the store answers `cancelled` (`duplicate`,
 * "already stored", until 2026-11-25). Without one (released
 * by the job after a long queue delay) the store inserts the message itself, and finish_delivery
 * (migration 20261128000000) deletes it in the same step: the store says 'cancelled' (the receiver
 * answers 250 saying so), the message is a 'cancelled' tombstone with no bytes kept, and the inbox
 * holds nothing for it. Whole and streamed messages alike, and several whole messages stored together
 * (one store_whole_messages call).
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, test } from 'node:test';
import { TOKENS } from '../../src/container.ts';
import type { Database } from '../../src/storage/database.ts';
import { PgInboxStore } from '../../src/storage/inbox-store.ts';
import { CHUNK_BYTES, PgMessageStore } from '../../src/storage/message-store.ts';
import { type Harness, startHarness } from '../support/harness.ts';

/** A delivery's summary when nothing in it matters here. */
const NO_SUMMARY = {
  fromName: null,
  fromAddress: null,
  subject: null,
  internetMessageId: null,
  authentication: null,
};

let h: Harness;
let db: Database;
before(async () => {
  h = await startHarness();
  db = h.container.resolve<Database>(TOKENS.Database);
});
after(() => h.close());

async function* pieces(data: Buffer): AsyncIterable<Buffer> {
  for (let at = 0; at < data.length; at += 65_536) yield data.subarray(at, at + 65_536);
}

for (const [kind, size] of [
  ['whole', 5_000],
  ['streamed', 2 * CHUNK_BYTES + 1],
] as const) {
  test(`a ${kind} message with no reservation, delivered after its inbox was cancelled, is kept as a tombstone only`, async () => {
    const inbox = await h.provision();
    const messages = new PgMessageStore(db);
    const queueId = `QCX${kind}`;
    const now = new Date();
    assert.ok(await new PgInboxStore(db).cancel(inbox.inbox_id, now));

    const stored = await messages.store(
      {
        inboxId: inbox.inbox_id,
        queueId,
        envelopeFrom: 's@example.test',
        now,
        summary: {
          fromName: null,
          fromAddress: 's@example.test',
          subject: 'late',
          internetMessageId: null,
          authentication: null,
        },
      },
      pieces(randomBytes(size)),
    );

    assert.equal(stored.kind, 'cancelled');
    const [row] = await db.rows<{
      state: string;
      deleted_reason: string;
      chunks: number;
      held_bytes: number;
    }>(
      'test-cancelled-delivery',
      `SELECT m.state, m.deleted_reason,
         (SELECT count(*)::int FROM message_chunks c WHERE c.inbox_id = m.inbox_id) AS chunks,
         (SELECT held_bytes FROM inboxes i WHERE i.inbox_id = m.inbox_id) AS held_bytes
       FROM messages m WHERE m.inbox_id = $1`,
      [inbox.inbox_id],
    );
    assert.deepEqual(row, { state: 'deleted', deleted_reason: 'cancelled', chunks: 0, held_bytes: 0 });
  });
}

test("a message reserved before its inbox was cancelled finds the cancel's tombstone: cancelled, nothing stored", async () => {
  const inbox = await h.provision();
  const messages = new PgMessageStore(db);
  const now = new Date();
  const reservation = {
    inboxId: inbox.inbox_id,
    messageId: 'msg_cancelled_reserved',
    queueId: 'QCXRESERVED',
    sizeBytes: 1500,
    envelopeFrom: 's@example.test',
    now,
  };
  assert.equal(await messages.reserve(reservation), 'reserved');
  assert.ok(await new PgInboxStore(db).cancel(inbox.inbox_id, now));

  const stored = await messages.store(
    {
      ...reservation,
      summary: NO_SUMMARY,
    },
    pieces(Buffer.from('late')),
  );

  assert.deepEqual(stored, { kind: 'cancelled', messageId: 'msg_cancelled_reserved' });
  const chunks = await db.rows('test-cancelled-chunks', 'SELECT 1 FROM message_chunks WHERE inbox_id = $1', [
    inbox.inbox_id,
  ]);
  assert.equal(chunks.length, 0);
});

test('whole messages stored together into a cancelled inbox (one batch call) each say cancelled', async () => {
  const inbox = await h.provision();
  const messages = new PgMessageStore(db);
  const now = new Date();
  assert.ok(await new PgInboxStore(db).cancel(inbox.inbox_id, now));
  const outcomes = await Promise.all(
    Array.from({ length: 6 }, (_, i) =>
      messages.store(
        {
          inboxId: inbox.inbox_id,
          queueId: `QCXBATCH${i}`,
          envelopeFrom: 's@example.test',
          now,
          summary: NO_SUMMARY,
        },
        pieces(randomBytes(2_000)),
      ),
    ),
  );
  assert.deepEqual(
    outcomes.map((o) => o.kind),
    Array(6).fill('cancelled'),
  );
  const [left] = await db.rows<{ undeleted: number; chunks: number }>(
    'test-cancelled-batch',
    `SELECT (SELECT count(*)::int FROM messages WHERE inbox_id = $1 AND state <> 'deleted') AS undeleted,
       (SELECT count(*)::int FROM message_chunks WHERE inbox_id = $1) AS chunks`,
    [inbox.inbox_id],
  );
  assert.deepEqual(left, { undeleted: 0, chunks: 0 });
});

test('the functions a receiver started before migration 20261203000000 calls keep their results (expand, not change)', async () => {
  const inbox = await h.provision();
  assert.ok(await new PgInboxStore(db).cancel(inbox.inbox_id, new Date()));
  const [whole] = await db.rows<{ out_kind: string }>(
    'test-old-store-whole',
    `SELECT out_kind FROM store_whole_message($1, 'msg_oldreceiver00000001', 'QOLD1', 's@example.test', now(),
       '\\x6869'::bytea, 262144, NULL, NULL, NULL, NULL, NULL, NULL)`,
    [inbox.inbox_id],
  );
  assert.deepEqual(whole, { out_kind: 'stored' });
  const [types] = await db.rows<{ finish: string }>(
    'test-old-finish-type',
    `SELECT pg_get_function_result('finish_delivery'::regproc) AS finish`,
    [],
  );
  assert.deepEqual(types, { finish: 'void' });
  const [left] = await db.rows<{ chunks: number }>(
    'test-old-store-chunks',
    'SELECT count(*)::int AS chunks FROM message_chunks WHERE inbox_id = $1',
    [inbox.inbox_id],
  );
  assert.deepEqual(left, { chunks: 0 });
});

test('a message stored, then deleted by the cancel, and delivered again (its 250 lost) is a duplicate, not cancelled', async () => {
  const inbox = await h.provision();
  const messages = new PgMessageStore(db);
  const queueId = 'QCXSTOREDFIRST';
  const stored = await h.deliver(inbox.inbox_id, 'Subject: first\r\n\r\nfirst\r\n', { queueId });
  assert.ok(await new PgInboxStore(db).cancel(inbox.inbox_id, new Date()));
  for (const size of [100, 2 * CHUNK_BYTES + 1]) {
    const again = await messages.store(
      {
        inboxId: inbox.inbox_id,
        queueId,
        envelopeFrom: 's@example.test',
        now: new Date(),
        summary: NO_SUMMARY,
      },
      pieces(randomBytes(size)),
    );
    assert.deepEqual(again, { kind: 'duplicate', messageId: stored }, `size ${size}`);
  }
});
