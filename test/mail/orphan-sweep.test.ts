/**
 * A milter killed between its reservation's commit and its answer (kill -9, the OOM killer, a container
 * stopped under load) left a reservation Postfix never heard of: Postfix answered the client 4xx and
 * queued nothing, the row held quota until RESERVATION_TTL_SECONDS (six days), and the sender's retry
 * into a nearly full inbox got `555 mailbox quota exceeded`. Each milter now writes a heartbeat saying
 * up to when it answered; a live milter releases what a dead one reserved after that.
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
import { MessageAdmission } from '../../src/core/message-admission.ts';
import { ReservationLedger } from '../../src/core/reservation-ledger.ts';
import type { CachingLookup } from '../../src/mail/dns.ts';
import { loadMailauth, MailauthAuthenticator } from '../../src/mail/mailauth-authenticator.ts';
import { MilterCheck } from '../../src/mail/milter-check.ts';
import { startOrphanSweep } from '../../src/mail/orphan-sweep.ts';
import type { Database } from '../../src/storage/database.ts';
import type { PgMilterIncarnations } from '../../src/storage/milter-incarnations.ts';
import { resolveInZone } from '../support/dns-zone.ts';
import { type Harness, startHarness } from '../support/harness.ts';
import { scalar } from '../support/jobs.ts';
import { milterEnvelope } from '../support/milter-message.ts';

// A reservation of reserve-and-die's message is about 4.5 KB: one fits in an inbox, two do not.
const QUOTA = 7_000;
let h: Harness;
let incarnations: PgMilterIncarnations;
before(async () => {
  await loadMailauth();
  h = await startHarness({ QUOTA_BYTES: String(QUOTA) });
  incarnations = h.container.resolve<PgMilterIncarnations>(TOKENS.MilterIncarnations);
});
after(() => h.close());

const used = async (inbox: ProvisionedInbox): Promise<number> =>
  (await h.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.owner })).json
    .quota_used_bytes;

/** A milter of this process, its reservations named by `ledger`. */
function milterOf(ledger: ReservationLedger): MilterCheck {
  const admission = new MessageAdmission(
    h.container.resolve(TOKENS.InboxStore),
    h.messages,
    h.clock,
    h.container.resolve(TOKENS.SmtpReplies),
    h.config,
    ledger,
  );
  return new MilterCheck(
    admission,
    new MailauthAuthenticator(h.config.authservId, { resolve: resolveInZone } as unknown as CachingLookup),
    h.config.authservId,
  );
}

/** `milter` deciding one message of reserve-and-die's size; the answer not yet handed to the MTA. */
async function decide(milter: MilterCheck, inbox: ProvisionedInbox, queueId: string) {
  const consumer = milter.beginMessage(milterEnvelope({ queueId, recipients: [inbox.address] }), [
    { name: 'From', value: ' S <s@allowed.test>' },
    { name: 'Subject', value: ' reserved' },
  ]);
  await consumer.body(Buffer.from(`${'x'.repeat(3000)}\r\n`));
  const { verdict } = await consumer.end();
  return { verdict, consumer };
}

/** The sender's retry through `milter`, answered at once. */
async function retry(milter: MilterCheck, inbox: ProvisionedInbox, queueId: string) {
  const { verdict, consumer } = await decide(milter, inbox, queueId);
  consumer.delivered?.();
  return verdict;
}

async function ownerOf(queueId: string): Promise<string | undefined> {
  const { rows } = await h.container
    .resolve<Database>(TOKENS.Database)
    .pool.query<{ owner: string }>('SELECT reserved_by::text AS owner FROM messages WHERE queue_id = $1', [
      queueId,
    ]);
  return rows[0]?.owner;
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

  // The sender retries after its 4xx: the ghost alone makes the inbox too full for it.
  assert.equal(await ownerOf('QUNANSWERED'), incarnation, 'the reservation names the milter that made it');
  const replacement = new ReservationLedger(randomUUID(), h.clock);
  const refused = await retry(milterOf(replacement), ghosted, 'QRETRY1');
  assert.equal(refused.kind === 'accept' ? 'accept' : refused.code, 555);

  const logged: Record<string, unknown>[] = [];
  let counted = 0;
  const sweep = startOrphanSweep(
    replacement,
    incarnations,
    (line) => logged.push(line),
    { intervalMs: 100, leaseSeconds: 1, marginSeconds: 0 },
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
    assert.equal((await retry(milterOf(replacement), ghosted, 'QRETRY2')).kind, 'accept');
    assert.equal(await used(ghosted), held);
  } finally {
    await sweep.stop();
  }
});

test('a live milter keeps its reservations however long its answer takes, while it beats', async () => {
  const inbox = await h.provision();
  const slow = new ReservationLedger(randomUUID(), h.clock);
  const slowSweep = startOrphanSweep(slow, incarnations, () => {}, {
    intervalMs: 100,
    leaseSeconds: 1,
    marginSeconds: 0,
  });
  await slowSweep.started;
  const { verdict, consumer } = await decide(milterOf(slow), inbox, 'QSLOW');
  assert.equal(verdict.kind, 'accept');
  assert.equal(await ownerOf('QSLOW'), slow.incarnation);
  const held = await used(inbox);
  assert.ok(held > 0);
  try {
    // Another milter sweeps for three leases; the slow one keeps beating with its answer still open.
    const other = startOrphanSweep(new ReservationLedger(randomUUID(), h.clock), incarnations, () => {}, {
      intervalMs: 100,
      leaseSeconds: 1,
      marginSeconds: 0,
    });
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

test('a milter that stops with everything answered leaves no heartbeat row; one with a decision open says so', async () => {
  const rowOf = async (incarnation: string) => {
    const { rows } = await h.container
      .resolve<Database>(TOKENS.Database)
      .pool.query<{ answered_before: Date }>(
        'SELECT answered_before FROM milter_incarnations WHERE incarnation_id = $1',
        [incarnation],
      );
    return rows[0];
  };
  const done = new ReservationLedger(randomUUID(), h.clock);
  const doneSweep = startOrphanSweep(done, incarnations, () => {});
  await doneSweep.started;
  assert.ok(await rowOf(done.incarnation), 'a running milter has its row');
  await doneSweep.stop();
  assert.equal(await rowOf(done.incarnation), undefined);

  const busy = new ReservationLedger(randomUUID(), h.clock);
  const busySweep = startOrphanSweep(busy, incarnations, () => {});
  await busySweep.started;
  const opened = h.clock.now();
  busy.open();
  h.clock.advance(30);
  await busySweep.stop();
  assert.deepEqual((await rowOf(busy.incarnation))?.answered_before, opened);
});
