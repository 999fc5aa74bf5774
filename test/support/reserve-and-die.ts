/**
 * reserve-and-die - a milter process, wired as the milter daemon wires it (its ledger, heartbeat and
 * MilterCheck over the real admission rules), that accepts two messages and hands only the first
 * one's answer to the MTA; test/mail/orphan-sweep.test.ts then kills it with SIGKILL, as the OOM killer
 * or a stopped container would, between the second reservation's commit and its answer:
 *   node test/support/reserve-and-die.ts <database url> <mail domain> <quota bytes> <answered> <unanswered>
 * where the last two are inbox addresses. Prints `reserved <incarnation>` once both are reserved and a
 * heartbeat has recorded the first answer and named the second as open.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { type Config, loadConfig } from '../../src/config/config.ts';
import { buildContainer, TOKENS } from '../../src/container.ts';
import type { MessageAdmission } from '../../src/core/message-admission.ts';
import type { ReservationLedger } from '../../src/core/reservation-ledger.ts';
import type { CachingLookup } from '../../src/mail/dns.ts';
import { loadMailauth, MailauthAuthenticator } from '../../src/mail/mailauth-authenticator.ts';
import { MilterCheck } from '../../src/mail/milter-check.ts';
import { startOrphanSweep } from '../../src/mail/orphan-sweep.ts';
import type { PgMilterIncarnations } from '../../src/storage/milter-incarnations.ts';
import { resolveInZone } from './dns-zone.ts';
import { milterEnvelope } from './milter-message.ts';

const [url, domain, quota, answered, unanswered] = process.argv.slice(2);
if (!url || !domain || !quota || !answered || !unanswered) throw new Error('usage: see the header');

await loadMailauth();
const config = loadConfig({
  ENVIRONMENT: 'dev',
  MAIL_DOMAIN: domain,
  QUOTA_BYTES: quota,
  DATABASE_URL: url,
  SECRET_KEY: 'test-secret-key-0123456789abcdefghijklmnop',
}) as Config & { secretKey: string };
const container = buildContainer(config, { log: () => {}, poolSize: 2 });
const ledger = container.resolve<ReservationLedger>(TOKENS.ReservationLedger);
const beat = 100;
const sweep = startOrphanSweep(
  ledger,
  container.resolve<PgMilterIncarnations>(TOKENS.MilterIncarnations),
  () => {},
  { intervalMs: beat, sweepIntervalMs: 3_600_000, leaseSeconds: 3600 },
);
await sweep.started;
const check = new MilterCheck(
  container.resolve<MessageAdmission>(TOKENS.MessageAdmission),
  new MailauthAuthenticator(config.authservId, { resolve: resolveInZone } as unknown as CachingLookup),
  config.authservId,
);

async function accept(address: string, queueId: string) {
  const consumer = check.beginMessage(milterEnvelope({ queueId, recipients: [address] }), [
    { name: 'From', value: ' S <s@allowed.test>' },
    { name: 'Subject', value: ' reserved' },
  ]);
  await consumer.body(Buffer.from(`${'x'.repeat(3000)}\r\n`));
  const { verdict } = await consumer.end();
  if (verdict.kind !== 'accept') throw new Error(`${address}: ${JSON.stringify(verdict)}`);
  return consumer;
}

(await accept(answered, 'QANSWERED')).delivered?.();
await accept(unanswered, 'QUNANSWERED');
// Heartbeats after both: the first answer is behind answeredBefore, the second is not.
await sleep(3 * beat);
process.stdout.write(`reserved ${ledger.incarnation}\n`);
await new Promise(() => {});
