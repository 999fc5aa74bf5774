/**
 * milter-check-bench - CPU per message of the milter's content check alone (src/mail/milter-check.ts:
 * the header block rebuilt, the body fed in 64 KiB chunks as Postfix sends them, mailauth's verdict,
 * the header edits), for unsigned and DKIM-signed messages of 10 KiB and 1 MiB. No sockets, no
 * Postgres (the admission accepts at once), DNS from the test zone without a server (resolveInZone,
 * test/support/dns-zone.ts): the figures isolate what mail-bench's milter column cannot, on a machine
 * whose end-to-end rates drift between runs.
 *
 *   node test/bench/milter-check-bench.ts   (BENCH_COUNT: 1 MiB messages per case, 300; ten times
 *                                            as many of 10 KiB)
 */
import type { MessageAdmission } from '../../src/core/message-admission.ts';
import type { AuthVerdict } from '../../src/core/ports.ts';
import { untrackedDecision } from '../../src/core/reservation-ledger.ts';
import type { CachingLookup } from '../../src/mail/dns.ts';
import { loadMailauth, MailauthAuthenticator } from '../../src/mail/mailauth-authenticator.ts';
import { MilterCheck } from '../../src/mail/milter-check.ts';
import type { MilterHeader } from '../../src/milter/handler.ts';
import { dkimSignFor, resolveInZone } from '../support/dns-zone.ts';
import { milterEnvelope, milterMessage } from '../support/milter-message.ts';

const COUNT = Number(process.env.BENCH_COUNT ?? 300);
/** Postfix's body chunk (MILTER_CHUNK_SIZE). */
const CHUNK = 65535;

const lookup = { resolve: resolveInZone } as unknown as CachingLookup;
/** Accepts every message; keeps the last one's authentication verdict, to check the signed case passes. */
let lastVerdict: AuthVerdict | undefined;
const accept = {
  open: () => untrackedDecision([], new Date()),
  admit: async (facts: { auth: AuthVerdict }) => {
    lastVerdict = facts.auth;
    return { kind: 'accept' };
  },
} as unknown as MessageAdmission;
const check = new MilterCheck(accept, new MailauthAuthenticator('mx.svc.test', lookup), 'mx.svc.test');
const envelope = milterEnvelope({
  queueId: 'BENCH1',
  clientAddress: '127.0.0.1',
  clientName: null,
  envelopeFrom: 'bench@allowed.test',
});

/** A message like smtp-source's (lines of "X"), as Postfix hands it to the milter. */
async function message(
  bytes: number,
  signed: boolean,
): Promise<{ headers: MilterHeader[]; chunks: Buffer[] }> {
  const body = `${'X'.repeat(78)}\r\n`.repeat(Math.ceil(bytes / 80)).slice(0, bytes);
  const head = 'From: <bench@allowed.test>\r\nTo: <x@svc.test>\r\nSubject: bench\r\n';
  let raw = `${head}\r\n${body}`;
  if (signed) raw = (await dkimSignFor('allowed.test', Buffer.from(raw, 'latin1'))).toString('latin1');
  const { headers, body: bodyBytes } = milterMessage(Buffer.from(raw, 'latin1'));
  const chunks: Buffer[] = [];
  for (let at = 0; at < bodyBytes.length; at += CHUNK) chunks.push(bodyBytes.subarray(at, at + CHUNK));
  return { headers, chunks };
}

async function run(m: { headers: MilterHeader[]; chunks: Buffer[] }, count: number): Promise<void> {
  for (let i = 0; i < count; i++) {
    const consumer = check.beginMessage(envelope, m.headers);
    for (const chunk of m.chunks) await consumer.body(chunk);
    const result = await consumer.end();
    if (result.verdict.kind !== 'accept') throw new Error('the check refused a benchmark message');
  }
}

async function main(): Promise<void> {
  await loadMailauth();
  process.stdout.write(
    `| message | signed | messages | CPU ms/message | wall ms/message |\n|---|---|---|---|---|\n`,
  );
  for (const [name, bytes, count] of [
    ['10 KiB', 10 * 1024, COUNT * 10],
    ['1 MiB', 1024 * 1024, COUNT],
  ] as const) {
    for (const signed of [false, true]) {
      const m = await message(bytes, signed);
      await run(m, Math.ceil(count / 5)); // warm-up: the JIT, mailauth's caches
      const cpu = process.cpuUsage();
      const started = performance.now();
      await run(m, count);
      const used = process.cpuUsage(cpu);
      if (lastVerdict?.alignedDkimPass !== signed) {
        throw new Error(`${name}, signed ${signed}: DKIM ${signed ? 'did not pass' : 'passed'}`);
      }
      const ms = (used.user + used.system) / 1000 / count;
      const wall = (performance.now() - started) / count;
      process.stdout.write(
        `| ${name} | ${signed ? 'yes' : 'no'} | ${count} | ${ms.toFixed(3)} | ${wall.toFixed(3)} |\n`,
      );
    }
  }
}

main().catch((error: unknown) => {
  process.stderr.write(`${error instanceof Error ? error.stack : String(error)}\n`);
  process.exit(1);
});
