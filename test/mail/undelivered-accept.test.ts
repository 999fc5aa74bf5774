/**
 * An accept that never reached Postfix (the milter's connection was lost while it decided, as when
 * Postfix's milter_content_timeout fires): Postfix answered the client 4xx and queued nothing, so the
 * quota the accept reserved is released at once, not RESERVATION_TTL_SECONDS later (the rows deleted,
 * so a delivery Postfix made after all would still be stored). A chaos run found
 * such reservations held for six days, and a retry of the message counted twice against the quota.
 * MilterCheck with the real MessageAdmission and PostgreSQL; mailauth answers from the test zone.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { TOKENS } from '../../src/container.ts';
import type { ProvisionedInbox } from '../../src/core/inbox-service.ts';
import { loadMailauth } from '../../src/mail/mailauth-authenticator.ts';
import type { MilterCheck } from '../../src/mail/milter-check.ts';
import { RESERVATION_SETTLE_MS } from '../../src/mail/milter-check.ts';
import type { MilterHeader } from '../../src/milter/handler.ts';
import { type Database, LOCK_TIMEOUT_MS } from '../../src/storage/database.ts';
import { type Harness, startHarness } from '../support/harness.ts';
import { scalar } from '../support/jobs.ts';
import { milterCheckOver, storeWith } from '../support/milter-check-over.ts';
import { milterEnvelope } from '../support/milter-message.ts';

let h: Harness;
let check: MilterCheck;
before(async () => {
  await loadMailauth();
  h = await startHarness();
  check = milterCheckOver(h);
});
after(() => h.close());

const headers: MilterHeader[] = [
  { name: 'From', value: ' S <s@allowed.test>' },
  { name: 'Subject', value: ' undelivered' },
];

async function decided(inbox: ProvisionedInbox, queueId: string, recipients = [inbox.address]) {
  const envelope = milterEnvelope({ queueId, recipients });
  const consumer = check.beginMessage(envelope, headers);
  await consumer.body(Buffer.from('body\r\n'));
  return { consumer, answer: await consumer.end() };
}

const used = async (inbox: ProvisionedInbox): Promise<number> =>
  (await h.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.owner })).json
    .quota_used_bytes;

test('an accept that never reached the MTA releases its reservation in every inbox at once', async () => {
  const a = await h.provision();
  const b = await h.provision();
  const { consumer, answer } = await decided(a, 'QLOST1', [a.address, b.address]);
  assert.equal(answer.verdict.kind, 'accept');
  const reserved = await used(a);
  assert.ok(reserved > 0, 'the accept reserved quota');
  assert.equal(await used(b), reserved);

  await consumer.undelivered();
  assert.deepEqual([await used(a), await used(b)], [0, 0]);
  assert.equal(await scalar(h, `SELECT count(*) FROM messages WHERE queue_id = 'QLOST1'`), 0, 'no tombstone');

  // Had Postfix queued it after all, its delivery would be stored, not taken for one already handled.
  await h.deliver(a.inbox_id, 'Subject: late\r\n\r\nlate\r\n', { queueId: 'QLOST1' });
  const listed = await h.api.get(`/v1/inboxes/${a.inbox_id}/messages`, { token: a.credentials.reader });
  assert.equal(listed.json.messages.length, 1);
});

test('undoing removes only what that accept reserved and is still in flight', async () => {
  const inbox = await h.provision();
  // The same queue id admitted twice: the second finds the first's reservation and makes none.
  const first = await decided(inbox, 'QTWICE1');
  const reserved = await used(inbox);
  const second = await decided(inbox, 'QTWICE1');
  assert.equal(second.answer.verdict.kind, 'accept');
  await second.consumer.undelivered();
  assert.equal(await used(inbox), reserved, "the first accept's reservation stays");

  // Stored by the receiver meanwhile: no longer in flight, so nothing is removed.
  await h.deliver(inbox.inbox_id, 'Subject: stored\r\n\r\nbody\r\n', { queueId: 'QTWICE1' });
  const withStored = await used(inbox);
  await first.consumer.undelivered();
  assert.equal(await used(inbox), withStored);
  assert.equal(
    await scalar(h, `SELECT count(*) FROM messages WHERE queue_id = 'QTWICE1' AND state = 'stored'`),
    1,
  );

  // A refusal reserved nothing, and undoing it changes nothing.
  await h.inboxes.cancel(inbox.inbox_id, h.clock.now());
  const refused = await decided(inbox, 'QREFUSED1');
  assert.equal(refused.answer.verdict.kind, 'reject');
  await refused.consumer.undelivered();
  assert.equal(await scalar(h, `SELECT count(*) FROM messages WHERE queue_id = 'QREFUSED1'`), 0);
});

test('a reservation that committed but whose call failed (the answer lost on the way back) is withdrawn at once', async () => {
  const inbox = await h.provision();
  // The statement commits, then its answer never arrives: the milter sees an error, answers `t`.
  const failing = milterCheckOver(h, {
    store: storeWith(h, 'reserveAll', (target) => async (reservations) => {
      await target.reserveAll(reservations);
      throw new Error('Connection terminated unexpectedly');
    }),
    settleMs: 20,
  });
  const consumer = failing.beginMessage(
    milterEnvelope({ queueId: 'QGHOST1', recipients: [inbox.address] }),
    headers,
  );
  await consumer.body(Buffer.from('body\r\n'));
  await assert.rejects(consumer.end(), /Connection terminated/);
  assert.ok((await used(inbox)) > 0, 'the reservation committed');

  await consumer.undelivered();
  assert.equal(await used(inbox), 0);
  assert.equal(await scalar(h, `SELECT count(*) FROM messages WHERE queue_id = 'QGHOST1'`), 0);
});

test('a withdrawal that fails (PostgreSQL still away) is tried again until it goes through', async () => {
  const inbox = await h.provision();
  let failures = 2;
  const retrying = milterCheckOver(h, {
    store: storeWith(h, 'withdrawReservations', (target) => async (keys) => {
      if (failures-- > 0) throw new Error('connect ECONNREFUSED 127.0.0.1:5432');
      return target.withdrawReservations(keys);
    }),
    withdrawRetryMs: [10, 10, 10],
  });
  const consumer = retrying.beginMessage(
    milterEnvelope({ queueId: 'QOUTAGE1', recipients: [inbox.address] }),
    headers,
  );
  await consumer.body(Buffer.from('body\r\n'));
  assert.equal((await consumer.end()).verdict.kind, 'accept');
  assert.ok((await used(inbox)) > 0, 'the accept reserved quota');

  await consumer.undelivered();
  assert.equal(failures, -1, 'two failed attempts, then one that went through');
  assert.equal(await used(inbox), 0);
  assert.equal(await scalar(h, `SELECT count(*) FROM messages WHERE queue_id = 'QOUTAGE1'`), 0);
});

test('a reservation whose connection broke while it waited for the inbox lock, and that committed after the withdrawal, is withdrawn again', async () => {
  const inbox = await h.provision();
  // Another transaction holds the inbox row, so the reservation waits for it inside PostgreSQL.
  const locker = new pg.Client({ connectionString: h.database.url });
  await locker.connect();
  // The withdrawals, in steps the test opens: the first is seen done; the second waits for the gate.
  let withdrawals = 0;
  let firstDone: () => void = () => {};
  const firstWithdrawn = new Promise<void>((resolve) => {
    firstDone = resolve;
  });
  let openGate: () => void = () => {};
  const gate = new Promise<void>((resolve) => {
    openGate = resolve;
  });
  const gated = storeWith(h, 'withdrawReservations', (target) => async (keys) => {
    withdrawals++;
    if (withdrawals === 1) {
      const removed = await target.withdrawReservations(keys);
      firstDone();
      return removed;
    }
    await gate;
    return target.withdrawReservations(keys);
  });
  let undoing: Promise<void> | undefined;
  try {
    const lockerPid = (await locker.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]?.pid;
    await locker.query('BEGIN');
    await locker.query('SELECT 1 FROM inboxes WHERE inbox_id = $1 FOR UPDATE', [inbox.inbox_id]);
    const settling = milterCheckOver(h, { store: gated, settleMs: 20, withdrawRetryMs: [10, 10] });
    const consumer = settling.beginMessage(
      milterEnvelope({ queueId: 'QSETTLE1', recipients: [inbox.address] }),
      headers,
    );
    await consumer.body(Buffer.from('body\r\n'));
    const ending = consumer.end();
    ending.catch(() => {});
    // The backend blocked by the locker (read from the lock table, pg_blocking_pids: exact).
    let waiting = 0;
    for (let i = 0; i < 500 && waiting === 0; i++) {
      waiting = await scalar(
        h,
        'SELECT coalesce(max(pid), 0) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))',
        [lockerPid],
      );
      if (waiting === 0) await sleep(10);
    }
    assert.ok(waiting, 'the reservation waits for the inbox lock');
    // The connection breaks on our side only (a reset proxy, a flushed NAT entry): its backend waits on.
    const clients = (
      h.container.resolve<Database>(TOKENS.Database).pool as unknown as { _clients: pg.Client[] }
    )._clients;
    const reserving = clients.find((c) => (c as unknown as { processID: number }).processID === waiting);
    assert.ok(reserving, "the pool's client of that backend");
    (reserving as unknown as { connection: { stream: { destroy(): void } } }).connection.stream.destroy();
    await assert.rejects(ending, /Connection terminated|ECONNRESET|EPIPE/);

    // The MTA heard `t`; the withdrawal runs at once and finds nothing yet.
    undoing = consumer.undelivered();
    undoing.catch(() => {});
    await firstWithdrawn;
    await locker.query('COMMIT');
    // The orphaned statement now commits its reservation.
    let held = 0;
    for (let i = 0; i < 500 && held === 0; i++) {
      held = await scalar(h, `SELECT count(*) FROM messages WHERE queue_id = 'QSETTLE1'`);
      if (held === 0) await sleep(10);
    }
    assert.equal(held, 1, 'the reservation committed after the withdrawal');

    openGate();
    await undoing;
    assert.equal(withdrawals, 2, 'withdrawn again');
    assert.equal(await scalar(h, `SELECT count(*) FROM messages WHERE queue_id = 'QSETTLE1'`), 0);
    assert.equal(await used(inbox), 0);
  } finally {
    openGate();
    await undoing?.catch(() => {});
    await locker.end();
  }
});

test('the second withdrawal waits past the lock timeout a reservation statement can wait for', () => {
  assert.ok(RESERVATION_SETTLE_MS > LOCK_TIMEOUT_MS);
});
