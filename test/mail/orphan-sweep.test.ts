/**
 * A milter killed between its reservation's commit and its answer (kill -9, the OOM killer, a container
 * stopped under load) left a reservation Postfix never heard of: Postfix answered the client 4xx and
 * queued nothing, the row held quota until RESERVATION_TTL_SECONDS (six days), and the sender's retry
 * into a nearly full inbox got `555 mailbox quota exceeded`. Each milter now writes a heartbeat naming
 * what it has not answered yet; a live milter releases that of a dead one.
 *
 * A real process (test/support/reserve-and-die.ts, wired as the milter daemon is) accepts two messages,
 * answers one, and is killed with SIGKILL; this process then plays its replacement. Real PostgreSQL;
 * mailauth answers from the test zone.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { once } from 'node:events';
import { after, before, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { TOKENS } from '../../src/container.ts';
import type { ProvisionedInbox } from '../../src/core/inbox-service.ts';
import type { MessageStore } from '../../src/core/ports.ts';
import { ReservationLedger } from '../../src/core/reservation-ledger.ts';
import { loadMailauth } from '../../src/mail/mailauth-authenticator.ts';
import type { MilterCheck } from '../../src/mail/milter-check.ts';
import { ORPHAN_SWEEP, startOrphanSweep } from '../../src/mail/orphan-sweep.ts';
import type { Database } from '../../src/storage/database.ts';
import type { PgMilterIncarnations } from '../../src/storage/milter-incarnations.ts';
import { type Harness, startHarness } from '../support/harness.ts';
import { scalar } from '../support/jobs.ts';
import { milterCheckOver, NO_SUMMARY, storeWith } from '../support/milter-check-over.ts';
import { milterEnvelope } from '../support/milter-message.ts';

// A reservation of reserve-and-die's message is about 4.5 KB: one fits in an inbox, two do not.
const QUOTA = 7_000;
/** The production timing, with a lease short enough to wait for. */
const FAST = { ...ORPHAN_SWEEP, intervalMs: 100, sweepIntervalMs: 100, leaseSeconds: 1 };
let h: Harness;
let incarnations: PgMilterIncarnations;
before(async () => {
  await loadMailauth();
  h = await startHarness({ QUOTA_BYTES: String(QUOTA) });
  incarnations = h.container.resolve<PgMilterIncarnations>(TOKENS.MilterIncarnations);
});
after(() => h.close());

const query = async <T>(sql: string, values: unknown[] = []): Promise<T[]> =>
  (await h.container.resolve<Database>(TOKENS.Database).pool.query(sql, values)).rows as T[];

const used = async (inbox: ProvisionedInbox): Promise<number> =>
  (await h.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.owner })).json
    .quota_used_bytes;

const ownersOf = async (queueId: string): Promise<(string | null)[]> =>
  (
    await query<{ owner: string | null }>(
      'SELECT reserved_by::text AS owner FROM messages WHERE queue_id = $1 ORDER BY inbox_id',
      [queueId],
    )
  ).map((r) => r.owner);

/** A milter of this process, its reservations named by `ledger`. */
const milterOf = (ledger: ReservationLedger, store?: MessageStore, withdrawRetryMs?: number[]) =>
  milterCheckOver(h, {
    ledger,
    ...(store ? { store } : {}),
    ...(withdrawRetryMs ? { withdrawRetryMs } : {}),
  });

/**
 * `milter` deciding one message (its reservation about 1.4 KB plus `bodyBytes`; reserve-and-die's body
 * is 3000); the answer not yet handed to the MTA.
 */
async function decide(milter: MilterCheck, recipients: ProvisionedInbox[], queueId: string, bodyBytes = 100) {
  const envelope = milterEnvelope({ queueId, recipients: recipients.map((r) => r.address) });
  const consumer = milter.beginMessage(envelope, [
    { name: 'From', value: ' S <s@allowed.test>' },
    { name: 'Subject', value: ' reserved' },
  ]);
  await consumer.body(Buffer.from(`${'x'.repeat(bodyBytes)}\r\n`));
  const { verdict } = await consumer.end();
  return { verdict, consumer };
}

/** The sender's retry through `milter`, answered at once. */
async function retry(milter: MilterCheck, inbox: ProvisionedInbox, queueId: string, bodyBytes = 100) {
  const { verdict, consumer } = await decide(milter, [inbox], queueId, bodyBytes);
  consumer.delivered?.();
  return verdict;
}

/** A ledger whose heartbeat row is written, then left to go silent (a milter that froze or died). */
async function silentLedger(): Promise<ReservationLedger> {
  const ledger = new ReservationLedger(randomUUID(), h.clock);
  await incarnations.beat(ledger.incarnation, ledger.snapshot());
  ledger.registered();
  return ledger;
}

/**
 * The milter of `ledger` is silent, as if for two hours: the next sweep takes it for dead. `beatFirst`:
 * it wrote one more heartbeat before it died (else it died right after its last one).
 */
async function diedLongAgo(ledger: ReservationLedger, beatFirst = true): Promise<void> {
  if (beatFirst) await incarnations.beat(ledger.incarnation, ledger.snapshot());
  await query(
    `UPDATE milter_incarnations SET heartbeat_at = now() - interval '2 hours' WHERE incarnation_id = $1`,
    [ledger.incarnation],
  );
}

async function until(what: string, ok: () => Promise<boolean>, ms = 10_000): Promise<void> {
  const started = Date.now();
  while (!(await ok())) {
    if (Date.now() - started > ms) throw new Error(`timed out waiting until ${what}`);
    await sleep(50);
  }
}

test('what a killed milter reserved and never answered is released by a live one; what it answered stays', async () => {
  const answered = await h.provision();
  const ghosted = await h.provision();
  const milter = spawn(
    process.execPath,
    [
      'test/support/reserve-and-die.ts',
      h.database.url,
      h.config.mailDomain,
      String(QUOTA),
      answered.address,
      ghosted.address,
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  let incarnation: string;
  try {
    const [said] = (await once(milter.stdout, 'data')) as [Buffer];
    const match = /^reserved (\S+)\n$/.exec(said.toString());
    assert.ok(match?.[1], `the milter said ${said.toString()}`);
    incarnation = match[1];
  } finally {
    milter.kill('SIGKILL');
  }
  await once(milter, 'exit');
  // The child reserved on the system clock; usage counts what was reserved by the harness's instant.
  h.clock.advance(60);
  const held = await used(ghosted);
  assert.ok(held > 0, 'the ghost holds quota');
  assert.equal(await used(answered), held, 'so does the answered one');
  assert.deepEqual(await ownersOf('QUNANSWERED'), [incarnation], 'the reservation names its milter');

  // The sender retries after its 4xx: the ghost alone makes the inbox too full for it.
  const replacement = new ReservationLedger(randomUUID(), h.clock);
  const refused = await retry(milterOf(replacement), ghosted, 'QRETRY1', 3000);
  assert.equal(refused.kind === 'accept' ? 'accept' : refused.code, 555);

  const logged: Record<string, unknown>[] = [];
  let counted = 0;
  const sweep = startOrphanSweep(
    replacement,
    incarnations,
    (line) => logged.push(line),
    FAST,
    (count) => {
      counted += count;
    },
  );
  try {
    await until('the ghost is released', async () => (await used(ghosted)) === 0);
    assert.equal(await used(answered), held, 'the answered reservation is kept for its delivery');
    assert.equal(
      await scalar(h, `SELECT count(*) FROM messages WHERE queue_id = 'QUNANSWERED'`),
      0,
      'deleted, not a tombstone: a delivery after all would still be stored',
    );
    await until(
      'the dead milter is forgotten',
      async () =>
        Number(
          await scalar(h, `SELECT count(*) FROM milter_incarnations WHERE incarnation_id = '${incarnation}'`),
        ) === 0,
    );
    assert.ok(
      logged.some((line) => line.level === 'warn' && line.reservations === 1 && line.milters === 1),
      JSON.stringify(logged),
    );
    assert.equal(counted, 1, 'counted for the metric');
    // The retry now fits, and is the only thing the inbox holds.
    assert.equal((await retry(milterOf(replacement), ghosted, 'QRETRY2', 3000)).kind, 'accept');
    assert.equal(await used(ghosted), held);
  } finally {
    await sweep.stop();
  }
});

test('a live milter keeps its reservations however long its answer takes, while it beats', async () => {
  const inbox = await h.provision();
  const slow = new ReservationLedger(randomUUID(), h.clock);
  const slowSweep = startOrphanSweep(slow, incarnations, () => {}, FAST);
  await slowSweep.started;
  const { verdict, consumer } = await decide(milterOf(slow), [inbox], 'QSLOW');
  assert.equal(verdict.kind, 'accept');
  assert.deepEqual(await ownersOf('QSLOW'), [slow.incarnation]);
  const held = await used(inbox);
  assert.ok(held > 0);
  try {
    // Another milter sweeps for three leases; the slow one keeps beating with its answer still open.
    const other = startOrphanSweep(
      new ReservationLedger(randomUUID(), h.clock),
      incarnations,
      () => {},
      FAST,
    );
    await sleep(3_000);
    await other.stop();
    assert.equal(await used(inbox), held);
    assert.equal(slow.openCount, 1);
    consumer.delivered?.();
    assert.equal(slow.openCount, 0);
  } finally {
    await slowSweep.stop();
  }
});

test('every path of a reservation names its milter: several inboxes at once, and one inbox batched', async () => {
  const ledger = await silentLedger();
  const [a, b] = [await h.provision(), await h.provision()];
  const milter = milterOf(ledger);
  const both = await decide(milter, [a, b], 'QBOTH');
  assert.equal(both.verdict.kind, 'accept');
  assert.deepEqual(await ownersOf('QBOTH'), [ledger.incarnation, ledger.incarnation]);
  // Concurrent decisions for one inbox: the reservations queued behind the first go as one batch.
  const one = await h.provision();
  const many = await Promise.all(['QB1', 'QB2', 'QB3', 'QB4'].map((q) => decide(milter, [one], q)));
  assert.deepEqual(
    many.map((m) => m.verdict.kind),
    ['accept', 'accept', 'accept', 'accept'],
  );
  for (const q of ['QB1', 'QB2', 'QB3', 'QB4']) assert.deepEqual(await ownersOf(q), [ledger.incarnation]);
  for (const m of [both, ...many]) m.consumer.delivered?.();
  assert.equal(ledger.openCount, 0);
});

test('a withdrawn decision closes; one whose withdrawal keeps failing stays named without holding back the rest', async () => {
  const ledger = await silentLedger();
  const inbox = await h.provision();
  const withdrawn = await decide(milterOf(ledger), [inbox], 'QWITHDRAWN');
  assert.equal(withdrawn.verdict.kind, 'accept');
  await withdrawn.consumer.undelivered();
  assert.equal(ledger.openCount, 0, 'closed once withdrawn');

  const failing = storeWith(h, 'withdrawReservations', () => async () => {
    throw new Error('connection refused');
  });
  const stuck = await decide(milterOf(ledger, failing, []), [inbox], 'QSTUCK');
  assert.equal(stuck.verdict.kind, 'accept');
  await assert.rejects(stuck.consumer.undelivered(), /connection refused/);
  h.clock.advance(5);
  const snapshot = ledger.snapshot();
  const [row] = await query<{ message_id: string; inbox_id: string }>(
    `SELECT inbox_id, message_id FROM messages WHERE queue_id = 'QSTUCK'`,
  );
  assert.deepEqual(snapshot.open, [{ inboxId: row?.inbox_id, messageId: row?.message_id }]);
  assert.deepEqual(snapshot.answeredBefore, h.clock.now(), 'a decision with keys holds back nothing');

  // It died so: the sweep releases the stuck one, and what it answered meanwhile stays.
  const answered = await retry(milterOf(ledger), inbox, 'QLATER');
  assert.equal(answered.kind, 'accept');
  h.clock.advance(5);
  await diedLongAgo(ledger);
  const release = await incarnations.releaseOrphans(60);
  assert.deepEqual(release, { dead: 1, released: 1, bytes: release.bytes });
  assert.equal(await scalar(h, `SELECT count(*) FROM messages WHERE queue_id = 'QSTUCK'`), 0);
  assert.deepEqual(await ownersOf('QLATER'), [ledger.incarnation]);
});

test('a ghost that was no ghost (Postfix queued it after all) is stored when delivered; one being stored is never released', async () => {
  const ledger = await silentLedger();
  const inbox = await h.provision();
  const queuedAfterAll = await decide(milterOf(ledger), [inbox], 'QAFTERALL');
  const beingStored = await decide(milterOf(ledger), [inbox], 'QSTORING');
  assert.deepEqual([queuedAfterAll.verdict.kind, beingStored.verdict.kind], ['accept', 'accept']);
  await diedLongAgo(ledger);

  // A large delivery of QSTORING holds its row (begin_delivery) while its body streams.
  let holding = () => {};
  const held = new Promise<void>((resolve) => {
    holding = resolve;
  });
  let finish = () => {};
  const gate = new Promise<void>((resolve) => {
    finish = resolve;
  });
  async function* body() {
    yield Buffer.alloc(300 * 1024, 'a');
    holding();
    await gate;
    yield Buffer.from('\r\n');
  }
  const delivery = {
    inboxId: inbox.inbox_id,
    envelopeFrom: 's@allowed.test',
    now: h.clock.now(),
    summary: NO_SUMMARY,
  };
  const storing = h.messages.store({ ...delivery, queueId: 'QSTORING' }, body());
  await held;
  const first = await incarnations.releaseOrphans(60);
  assert.deepEqual({ ...first, bytes: 0 }, { dead: 1, released: 1, bytes: 0 }, 'only QAFTERALL');
  finish();
  assert.equal((await storing).kind, 'stored');
  assert.deepEqual(
    await incarnations.releaseOrphans(60),
    { dead: 1, released: 0, bytes: 0 },
    'kept until its skipped row was settled',
  );
  assert.equal(
    await scalar(
      h,
      `SELECT count(*) FROM milter_incarnations WHERE incarnation_id = '${ledger.incarnation}'`,
    ),
    0,
  );

  // Postfix had queued QAFTERALL: its delivery comes, and is stored once.
  async function* small() {
    yield Buffer.from('Subject: after all\r\n\r\nbody\r\n');
  }
  assert.equal((await h.messages.store({ ...delivery, queueId: 'QAFTERALL' }, small())).kind, 'stored');
  const listed = await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, {
    token: inbox.credentials.reader,
  });
  assert.equal(listed.json.messages.length, 2);
});

test('a milter that stops with everything answered leaves no heartbeat row; one with a decision open names it', async () => {
  const rowOf = async (incarnation: string) =>
    (
      await query<{ answered_before: Date; open_message_ids: string[] }>(
        'SELECT answered_before, open_message_ids FROM milter_incarnations WHERE incarnation_id = $1',
        [incarnation],
      )
    )[0];
  const done = new ReservationLedger(randomUUID(), h.clock);
  const doneSweep = startOrphanSweep(done, incarnations, () => {});
  await doneSweep.started;
  assert.ok(await rowOf(done.incarnation), 'a running milter has its row');
  await doneSweep.stop();
  assert.equal(await rowOf(done.incarnation), undefined);

  const busy = new ReservationLedger(randomUUID(), h.clock);
  const busySweep = startOrphanSweep(busy, incarnations, () => {});
  await busySweep.started;
  const decision = busy.open([{ inboxId: 'someinbox', messageId: 'msg_open' }]);
  assert.equal(decision.owner, busy.incarnation);
  h.clock.advance(30);
  await busySweep.stop();
  const row = await rowOf(busy.incarnation);
  assert.deepEqual(row?.open_message_ids, ['msg_open'], 'the last heartbeat names what is open');
  assert.ok(row && row.answered_before >= decision.now);
  assert.equal(busy.open([]).owner, null, 'a decision opened after the stop names no milter');
});

test('killed after reserving and before its next heartbeat named it: released by its instant, even with the clock stepped back', async () => {
  for (const step of [1, -2]) {
    const ledger = await silentLedger();
    const inbox = await h.provision();
    // An NTP step back between the last heartbeat and the reservation must not date the row before it.
    h.clock.advance(step);
    const ghost = await decide(milterOf(ledger), [inbox], `QUNNAMED${step}`);
    assert.equal(ghost.verdict.kind, 'accept');
    await diedLongAgo(ledger, false);
    const release = await incarnations.releaseOrphans(60);
    assert.equal(release.released, 1, `clock moved ${step} s: the unnamed ghost is released`);
    assert.equal(await used(inbox), 0);
  }
});

test('a refusal still recording its rejection holds nothing back: what the milter answered meanwhile stays', async () => {
  const ledger = await silentLedger();
  const refusing = await h.provision(['only-this.test']); // s@allowed.test is not admitted
  const open = await h.provision();
  let recorded = () => {};
  const gate = new Promise<void>((resolve) => {
    recorded = resolve;
  });
  // Recording waits, as for the inbox row's lock (lock_timeout 20 s) or a pool connection.
  const slowRecord = storeWith(h, 'recordRejection', (target) => async (...args) => {
    await gate;
    return target.recordRejection(...args);
  });
  const refusal = decide(milterOf(ledger, slowRecord), [refusing], 'QREFUSING');
  for (let i = 0; i < 3; i++) {
    h.clock.advance(2);
    assert.equal((await retry(milterOf(ledger), open, `QMEANWHILE${i}`)).kind, 'accept');
    h.clock.advance(1); // a heartbeat a second later (within its millisecond, an answer counts as not)
    await incarnations.beat(ledger.incarnation, ledger.snapshot());
  }
  await diedLongAgo(ledger, false);
  const release = await incarnations.releaseOrphans(60);
  recorded();
  assert.equal((await refusal).verdict.kind === 'accept', false);
  assert.deepEqual(release, { dead: 1, released: 0, bytes: 0 });
  assert.equal(ledger.openCount, 0, 'a refusal closes its decision: the ledger keeps nothing of it');
});

test('a sweep waiting for a lock does not hold back the heartbeat', async () => {
  const dead = await silentLedger();
  const inbox = await h.provision();
  assert.equal((await decide(milterOf(dead), [inbox], 'QLOCKED')).verdict.kind, 'accept');
  await diedLongAgo(dead);
  // The inbox row is held (the expire job's pick takes it FOR SHARE): the release waits for it.
  const client = await h.container.resolve<Database>(TOKENS.Database).pool.connect();
  const live = new ReservationLedger(randomUUID(), h.clock);
  let sweep: ReturnType<typeof startOrphanSweep> | undefined;
  try {
    await client.query('BEGIN');
    await client.query('SELECT 1 FROM inboxes WHERE inbox_id = $1 FOR SHARE', [inbox.inbox_id]);
    sweep = startOrphanSweep(live, incarnations, () => {}, FAST);
    const beats = new Set<number>();
    const started = Date.now();
    while (Date.now() - started < 2_000) {
      const [row] = await query<{ at: Date }>(
        'SELECT heartbeat_at AS at FROM milter_incarnations WHERE incarnation_id = $1',
        [live.incarnation],
      );
      if (row) beats.add(row.at.getTime());
      await sleep(20);
    }
    assert.ok(beats.size >= 8, `${beats.size} heartbeats in 2 s at 100 ms`);
  } finally {
    await client.query('COMMIT');
    client.release();
  }
  await until('the ghost is released once the lock is gone', async () => (await used(inbox)) === 0);
  await sweep?.stop();
});
