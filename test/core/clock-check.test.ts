/**
 * clock-check: the host's clock read against PostgreSQL's (here a function), into a CheckedClock that
 * stops telling the time while they disagree by more than MAX_CLOCK_SKEW_SECONDS.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  CheckedClock,
  ClockSkewError,
  MAX_CLOCK_SKEW_SECONDS,
  watchClock,
} from '../../src/core/clock-check.ts';
import { ReservationLedger } from '../../src/core/reservation-ledger.ts';

test('a clock off PostgreSQL by more than the bound stops telling the time until they agree again; each change logged once', async () => {
  const database = 1_700_000_000_000;
  let offset = 0;
  let failing = false;
  const lines: Record<string, unknown>[] = [];
  const clock = new CheckedClock({ now: () => new Date(database) });
  const readings: (() => Promise<void>)[] = [];
  const read = async () => {
    const watch = watchClock(
      clock,
      async () => {
        if (failing) throw new Error('connect ECONNREFUSED');
        return database;
      },
      (line) => lines.push(line),
      { wall: () => database + offset, intervalMs: 3_600_000 },
    );
    watch.stop();
    await watch.first;
  };
  readings.push(read);

  await read();
  assert.equal(clock.skewed, null);
  assert.equal(clock.now().getTime(), database);

  offset = (MAX_CLOCK_SKEW_SECONDS - 1) * 1000;
  await read();
  assert.equal(clock.skewed, null, 'within the bound');

  offset = 20 * 60 * 1000;
  await read();
  await read();
  assert.equal(clock.skewed, "this host's clock is 1200 s ahead of PostgreSQL's (more than 30 s)");
  assert.throws(() => clock.now(), ClockSkewError);
  assert.deepEqual(lines, [
    {
      level: 'error',
      msg: "this host's clock is 1200 s ahead of PostgreSQL's (more than 30 s): what needs the time fails until the clocks agree (mail deferred with 4xx, API 500)",
    },
  ]);

  // A reading that fails changes nothing.
  failing = true;
  offset = 0;
  await read();
  assert.notEqual(clock.skewed, null);

  failing = false;
  offset = -(MAX_CLOCK_SKEW_SECONDS + 10) * 1000;
  await read();
  assert.equal(clock.skewed, "this host's clock is 40 s behind PostgreSQL's (more than 30 s)");
  assert.equal(lines.length, 1, 'still skewed: not logged again');

  offset = 0;
  await read();
  assert.equal(clock.skewed, null);
  assert.equal(clock.now().getTime(), database);
  assert.deepEqual(lines.at(-1), { msg: "clock agrees with PostgreSQL's again" });
});

test('a reservation ledger on a refusing clock opens no decision and leaves nothing open; its heartbeat goes on at its last instant', () => {
  const start = 1_700_000_000_000;
  let now = start;
  const clock = new CheckedClock({ now: () => new Date(now) });
  const ledger = new ReservationLedger('incarnation', clock);
  ledger.open([{ inboxId: 'a'.repeat(20), messageId: 'm0' }]).close();
  // The host's clock jumps 20 minutes ahead; the check catches it.
  now = start + 20 * 60_000;
  clock.skewed = "this host's clock is 1200 s ahead of PostgreSQL's (more than 30 s)";
  for (let i = 1; i < 4; i++)
    assert.throws(() => ledger.open([{ inboxId: 'a'.repeat(20), messageId: `m${i}` }]), ClockSkewError);
  assert.equal(ledger.openCount, 0, 'no keys left behind that nothing closes');
  // The heartbeat still names this live process (else the orphan sweep takes it for dead), with the
  // last instant handed out, not the time of the clock that is off.
  assert.deepEqual(ledger.snapshot(), { answeredBefore: new Date(start), open: [] });
  // Corrected: decisions are dated by the right time, not by the 20 minutes ahead.
  now = start + 30_000;
  clock.skewed = null;
  const decision = ledger.open([{ inboxId: 'a'.repeat(20), messageId: 'm9' }]);
  assert.equal(decision.now.getTime(), start + 30_000);
  assert.equal(decision.reservedAt.getTime(), start + 30_000);
  assert.equal(ledger.openCount, 1);
  decision.close();
  assert.equal(ledger.openCount, 0);
});

test('until a first reading succeeds it is tried again every retryMs, not every interval', async () => {
  const database = 1_700_000_000_000;
  let failures = 3;
  const clock = new CheckedClock({ now: () => new Date(database) });
  const watch = watchClock(
    clock,
    async () => {
      if (failures-- > 0) throw new Error('connect ECONNREFUSED');
      return database;
    },
    () => {},
    { wall: () => database + 20 * 60_000, intervalMs: 3_600_000, retryMs: 5 },
  );
  try {
    await watch.first;
    assert.equal(clock.skewed, null, 'the first reading failed');
    for (let waited = 0; clock.skewed === null && waited < 2_000; waited += 5)
      await new Promise((resolve) => setTimeout(resolve, 5));
    assert.match(clock.skewed ?? '', /1200 s ahead/);
  } finally {
    watch.stop();
  }
});

test('a clock stepped back after running ahead: decisions go by its time, their reservations keep the last instant', () => {
  const start = 1_700_000_000_000;
  let now = start + 20 * 60_000; // ahead, before a reading caught it
  const ledger = new ReservationLedger('incarnation', { now: () => new Date(now) });
  ledger.open([]).close();
  assert.deepEqual(ledger.snapshot().answeredBefore, new Date(start + 20 * 60_000));
  now = start; // corrected
  const decision = ledger.open([{ inboxId: 'a'.repeat(20), messageId: 'm1' }]);
  assert.equal(decision.now.getTime(), start, 'decided by the corrected time');
  assert.equal(decision.reservedAt.getTime(), start + 20 * 60_000, 'never dated before a named instant');
  decision.close();
});
