/**
 * crash-soak - "impossible to lose mail in", tried under fire: mail flows through the whole stack while
 * its parts are killed, frozen and cut off from PostgreSQL at random (chaos.ts), and at the end every
 * message the sending MTA accepted must be stored exactly once in each of its inboxes, byte for byte,
 * with nothing bounced, refused for good or left reserved (soak-checks.ts).
 *
 * The stack: dnsmasq with the test zone; our Postfix rendered from postfix/ (its retries every 2 s
 * instead of minutes, so that a run ends); the policy daemon, milter and LMTP receiver as processes of
 * their own (`node src/main.ts ...`, the production shape, so a kill is a real SIGKILL); a second
 * Postfix as the sending MTA (test/support/sender-postfix.ts), which retries every temporary failure
 * as a real sender does. Messages (soak-mail.ts) are handed to the sending MTA at SOAK_RATE per second
 * for SOAK_SECONDS while faults come every 1.5-4 s; then the faults stop, both queues drain, and the
 * milters' sweep gets a lease and a sweep to release what the killed milters reserved.
 *
 *   node test/soak/crash-soak.ts   (make soak; SOAK_SECONDS 90, SOAK_RATE 30, SOAK_INBOXES 6,
 *                                   SOAK_FAULTS: only these kinds, e.g. "kill milter,database away";
 *                                   SOAK_QUOTA: each inbox's quota in bytes, small for refusals;
 *                                   SOAK_SEED: a run's choices again)
 *
 * Prints the faults injected, what the sending MTA saw, and each check; exits 1 if one fails. The
 * daemons' logs and both Postfix logs stay in the run directory it names when a check fails.
 */
import { chmod, mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { type Config, loadConfig } from '../../src/config/config.ts';
import { buildContainer, TOKENS } from '../../src/container.ts';
import type { InboxService } from '../../src/core/inbox-service.ts';
import { ORPHAN_SWEEP } from '../../src/mail/orphan-sweep.ts';
import { PostfixInstance } from '../../src/postfix/instance.ts';
import { renderPostfix } from '../../src/postfix/render.ts';
import { ADMIN_URL, recreateDatabase } from '../support/database.ts';
import { testZone } from '../support/dns-zone.ts';
import { startDnsmasq } from '../support/dnsmasq.ts';
import { seededRandom } from '../support/seeded-random.ts';
import { freePorts, startSenderPostfix } from '../support/sender-postfix.ts';
import { queuedAs, sendMail } from '../support/smtp-client.ts';
import { Agent } from './agent.ts';
import { type Chaos, startChaos } from './chaos.ts';
import { Daemon } from './daemons.ts';
import {
  type CheckResult,
  checkAccounts,
  checkAgents,
  checkLogs,
  checkStorage,
  inFlight,
  quotaRefusals,
  summarizeLog,
} from './soak-checks.ts';
import { soakMessage } from './soak-mail.ts';

const DB_NAME = 'inbox_crash_soak';
const SECONDS = Number(process.env.SOAK_SECONDS ?? 90);
const RATE = Number(process.env.SOAK_RATE ?? 30);
const INBOXES = Number(process.env.SOAK_INBOXES ?? 6);
/** SOAK_FAULTS: comma-separated kinds (`kill milter,database away`) to inject only those. */
const FAULTS = (process.env.SOAK_FAULTS ?? '')
  .split(',')
  .map((kind) => kind.trim())
  .filter(Boolean);
const SEED = Number(process.env.SOAK_SEED ?? Math.floor(Math.random() * 1e9));
/** SOAK_QUOTA: each inbox's quota in bytes (default 10 GiB: nothing refused); small, refusals for quota. */
const QUOTA = process.env.SOAK_QUOTA ? Number(process.env.SOAK_QUOTA) : undefined;
const DRAIN_TIMEOUT_MS = 10 * 60_000;
/** Our Postfix retries deferred mail every 2 s (production: queue_run_delay and backoff of minutes). */
const FAST_RETRY = { queue_run_delay: '2s', minimal_backoff_time: '2s', maximal_backoff_time: '4s' };

const started = performance.now();
const log = (line: string) => console.log(`[${((performance.now() - started) / 1000).toFixed(1)} s] ${line}`);

async function main(): Promise<number> {
  const run = SEED.toString(36);
  log(`seed ${SEED} (SOAK_SEED=${SEED} repeats this run's choices)`);
  const dbUrl = await recreateDatabase(DB_NAME, ADMIN_URL);
  const dns = await startDnsmasq({ records: testZone().records });
  const baseDir = await mkdtemp(join(tmpdir(), 'crash-soak-'));
  await chmod(baseDir, 0o755); // the postfix user must reach the queues below it
  const [policyPort, milterPort, lmtpPort, smtpPort] = (await freePorts(4)) as [
    number,
    number,
    number,
    number,
  ];
  const apiPort = (await freePorts(1))[0] as number;
  const env: Record<string, string> = {
    ENVIRONMENT: 'dev',
    DATABASE_URL: dbUrl,
    SECRET_KEY: 'crash-soak-secret-key-0123456789abcdef',
    MAIL_DOMAIN: 'svc.test',
    AUTHSERV_ID: 'mx.svc.test',
    DNS_SERVERS: dns.address,
    QUOTA_BYTES: String(QUOTA ?? 10 * 1024 ** 3),
    POLICY_PORT: String(policyPort),
    MILTER_PORT: String(milterPort),
    LMTP_PORT: String(lmtpPort),
    SMTP_PORT: String(smtpPort),
    API_PORT: String(apiPort),
    PUBLIC_BASE_URL: `http://127.0.0.1:${apiPort}`,
    METRICS_PORT: '0',
    // The agents poll every 0.3 s and download everything: far above the contract's agent pace.
    POLL_RATE_BURST: '1000',
    POLL_RATE_PER_SECOND: '100',
    DOWNLOAD_RATE_BURST: '1000',
    DOWNLOAD_RATE_PER_SECOND: '100',
  };
  const config = loadConfig(env) as Config & { secretKey: string };
  const container = buildContainer(config, { log: () => {} });
  const inboxService = container.resolve<InboxService>(TOKENS.InboxService);
  const inboxes: { inbox_id: string; address: string; credentials: { reader: string } }[] = [];
  for (let i = 0; i < INBOXES; i++) inboxes.push((await inboxService.provision([])).body);

  const daemons = [
    new Daemon('policy', policyPort, env, baseDir),
    new Daemon('milter', milterPort, env, baseDir),
    new Daemon('lmtp', lmtpPort, env, baseDir),
    new Daemon('api', apiPort, env, baseDir),
  ];
  const sentBytes = (messageId: string) => {
    const n = /^soak-[0-9a-z]+-(\d+)@allowed\.test$/.exec(messageId)?.[1];
    return n === undefined ? undefined : soakMessage(run, SEED, Number(n), INBOXES).bytes;
  };
  const agents = inboxes.map(
    (inbox) => new Agent(inbox.inbox_id, inbox.credentials.reader, `http://127.0.0.1:${apiPort}`, sentBytes),
  );
  const mx = new PostfixInstance({
    baseDir: join(baseDir, 'mx'),
    render: (dirs) => renderPostfix(config, dirs, FAST_RETRY),
    smtp: { host: '127.0.0.1', port: smtpPort },
  });
  let chaos: Chaos | undefined;
  let sender: Awaited<ReturnType<typeof startSenderPostfix>> | undefined;
  let failed = true;
  try {
    for (const daemon of daemons) await daemon.start();
    await mx.prepare();
    await mx.start({ resolvConf: dns.resolvConfPath });
    sender = await startSenderPostfix({
      runDir: baseDir,
      relayHost: '127.0.0.1',
      relayPort: smtpPort,
      backoffSeconds: 2,
      resolvConf: dns.resolvConfPath,
    });
    const senderPort = sender.port;
    log(`stack up in ${baseDir}; ${INBOXES} inboxes, ${RATE} messages/s for ${SECONDS} s with faults`);

    for (const agent of agents) agent.start();
    const random = seededRandom(SEED);
    chaos = startChaos({
      daemons,
      adminUrl: ADMIN_URL,
      database: DB_NAME,
      random,
      gapMs: [1500, 4000],
      only: FAULTS,
      log,
    });

    // Hand messages to the sending MTA at RATE per second.
    const accepted: { n: number; queueId: string }[] = [];
    const notTaken: string[] = [];
    const total = Math.round(SECONDS * RATE);
    const begin = performance.now();
    let next = 0;
    const worker = async () => {
      for (let n = next++; n < total; n = next++) {
        const wait = begin + (n * 1000) / RATE - performance.now();
        if (wait > 0) await sleep(wait);
        const message = soakMessage(run, SEED, n, INBOXES);
        const to = message.inboxes.map((i) => inboxes[i]?.address as string);
        const replies = await sendMail(senderPort, {
          from: 'sender@allowed.test',
          to,
          message: message.bytes,
          localAddress: '127.0.0.1',
        });
        const queueId = queuedAs(replies);
        if (queueId) accepted.push({ n, queueId });
        else
          notTaken.push(`${n}: ${replies.end?.text ?? replies.rcpt.at(-1)?.text ?? replies.greeting.text}`);
      }
    };
    await Promise.all(Array.from({ length: 8 }, worker));
    log(`handed ${accepted.length} of ${total} messages to the sending MTA`);
    await chaos.stop();
    log(`faults stopped: ${[...chaos.counts].map(([kind, n]) => `${kind} ${n}`).join(', ')}`);

    // Both queues drain: flushed every 10 s so that nothing waits out a backoff.
    const drainStart = performance.now();
    for (let flushed = 0; ; await sleep(500)) {
      if ((await sender.instance.queueEmpty()) && (await mx.queueEmpty())) break;
      if (performance.now() - drainStart > DRAIN_TIMEOUT_MS)
        throw new Error('the queues did not drain in 10 minutes');
      if (performance.now() - drainStart > (flushed + 1) * 10_000) {
        flushed++;
        await Promise.all([sender.instance.flush(), mx.flush()]);
      }
    }
    log(`both queues empty after ${((performance.now() - drainStart) / 1000).toFixed(1)} s`);
    await Promise.all(agents.map((agent) => agent.stop()));
    log('the agents have polled and downloaded everything');

    const client = new pg.Client({ connectionString: dbUrl });
    await client.connect();
    try {
      // What the killed milters reserved is released by the live one within a lease and a sweep.
      const sweepBy = performance.now() + ORPHAN_SWEEP.leaseSeconds * 1000 + 3 * ORPHAN_SWEEP.sweepIntervalMs;
      let left = await inFlight(client);
      if (left.owned > 0) log(`${left.owned} reservations of killed milters wait for the sweep`);
      while (left.owned > 0 && performance.now() < sweepBy) {
        await sleep(1000);
        left = await inFlight(client);
      }
      const senderLog = await sender.instance.maillog();
      const mxLog = await mx.maillog();
      const results: CheckResult[] = [
        ...(await checkStorage(client, {
          run,
          seed: SEED,
          inboxIds: inboxes.map((i) => i.inbox_id),
          addresses: inboxes.map((i) => i.address),
          accepted,
          refusedForQuota: quotaRefusals(senderLog),
        })),
        ...(await checkAccounts(client, QUOTA !== undefined)),
        ...(await checkAgents(client, agents)),
        {
          name: 'no reservation left by a killed milter',
          ok: left.owned === 0,
          detail: `${left.owned} left; ${left.unowned} unnamed (left to release-reservations)`,
        },
        {
          name: 'the sending MTA took every message',
          ok: notTaken.length === 0,
          detail: notTaken.slice(0, 3).join('; ') || 'all',
        },
        ...checkLogs(senderLog, mxLog, QUOTA !== undefined),
      ];
      const deferred = (text: string) => text.match(/status=deferred/g)?.length ?? 0;
      log(
        `deferred and retried: ${deferred(senderLog)} times by the sending MTA (refused with a 4xx), ` +
          `${deferred(mxLog)} times by our Postfix (the LMTP delivery failed for the time being)`,
      );
      for (const daemon of daemons) {
        const summary = summarizeLog(await readFile(daemon.logFile, 'utf8'));
        log(
          `${daemon.name}: started ${daemon.starts} times, ${summary.errors} error and ${summary.warnings} warning lines`,
        );
        for (const line of summary.top) log(`  ${line}`);
        if (summary.firstError) log(`  first error line: ${summary.firstError}`);
      }
      results.push({
        name: 'no daemon exited on its own',
        ok: daemons.every((daemon) => daemon.crashes.length === 0),
        detail: daemons.map((daemon) => `${daemon.name} ${daemon.crashes.join(' ') || 'none'}`).join(', '),
      });
      for (const result of results) log(`${result.ok ? 'ok  ' : 'FAIL'} ${result.name}: ${result.detail}`);
      failed = results.some((result) => !result.ok);
    } finally {
      await client.end();
    }
  } finally {
    await chaos?.stop().catch(() => undefined);
    await sender?.stop().catch(() => undefined);
    await mx.stop().catch(() => undefined);
    for (const daemon of daemons) await daemon.stop().catch(() => undefined);
    await dns.stop().catch(() => undefined);
    await container
      .resolve<{ close(): Promise<void> }>(TOKENS.Database)
      .close()
      .catch(() => undefined);
    if (failed) {
      for (const daemon of daemons) {
        const text = await readFile(daemon.logFile, 'utf8').catch(() => '');
        log(`${daemon.name} log, last lines:\n${text.split('\n').slice(-8).join('\n')}`);
      }
      log(`logs kept in ${baseDir}`);
    } else {
      await rm(baseDir, { recursive: true, force: true });
    }
  }
  return failed ? 1 : 0;
}

main().then(
  (code) => process.exit(code),
  (error) => {
    console.error(error);
    process.exit(1);
  },
);
