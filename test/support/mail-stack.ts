/**
 * mail-stack - the whole receiving side for end-to-end tests: a private Postfix instance whose DNS is a
 * dnsmasq with the test zone, our policy daemon, milter and LMTP receiver on real sockets, and the API
 * over a fresh database (test/support/harness.ts). Mail is sent with real SMTP from 127.x addresses.
 * Only the clock (the API harness's) and DNS (dnsmasq) are stand-ins.
 */
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Config } from '../../src/config/config.ts';
import { TOKENS } from '../../src/container.ts';
import { startLmtp } from '../../src/daemons/lmtp.ts';
import { startMilter } from '../../src/daemons/milter.ts';
import { startPolicy } from '../../src/daemons/policy.ts';
import type { Log, LogLine } from '../../src/log.ts';
import { PostfixInstance } from '../../src/postfix/instance.ts';
import { renderPostfix } from '../../src/postfix/render.ts';
import type { InboxChangeFeed } from '../../src/storage/inbox-changes.ts';
import { testZone } from './dns-zone.ts';
import { type Dnsmasq, startDnsmasq } from './dnsmasq.ts';
import { type Harness, startHarness } from './harness.ts';
import { freePort, type SenderPostfix, startSenderPostfix } from './sender-postfix.ts';
import { sendMail, type Transaction, type TransactionReplies } from './smtp-client.ts';

export const MAIL_DOMAIN = 'svc.test';
export const AUTHSERV_ID = 'mx.svc.test';

type DaemonName = 'policy' | 'milter' | 'lmtp';

export interface MailStack extends Harness {
  postfix: PostfixInstance;
  dns: Dnsmasq;
  smtpPort: number;
  /** Every line the daemons logged, newest last. */
  logs: LogLine[];
  /** One SMTP session from 127.0.0.3 (unless `localAddress` says otherwise). */
  send(t: Partial<Transaction> & Pick<Transaction, 'to' | 'message'>): Promise<TransactionReplies>;
  stopDaemon(name: DaemonName): Promise<void>;
  startDaemon(name: DaemonName): Promise<void>;
  /**
   * Resolves once the policy daemon has heard of every inbox and opt-out change committed so far (it
   * keeps what RCPT read until PostgreSQL announces a change; an announcement takes a moment).
   */
  announced(): Promise<void>;
  /** Polls `check` until it returns a value other than undefined, or fails after `timeoutMs`. */
  waitFor<T>(what: string, check: () => Promise<T | undefined>, timeoutMs?: number): Promise<T>;
}

export interface MailStackOptions {
  /** Extra environment for the service (e.g. QUOTA_BYTES). */
  env?: Record<string, string>;
  /** Extra main.cf parameters for the receiving Postfix. */
  postfix?: Record<string, string>;
}

export async function startMailStack(options: MailStackOptions = {}): Promise<MailStack> {
  // What has started, stopped in reverse order by close(), or at once when a later start fails (a
  // before() that throws leaves nothing running for node --test to wait on).
  const stops: (() => Promise<unknown>)[] = [];
  const stopAll = async () => {
    for (const stop of stops.splice(0).reverse()) await stop().catch(() => undefined);
  };
  try {
    return await startStack(options, stops, stopAll);
  } catch (error) {
    await stopAll();
    throw error;
  }
}

async function startStack(
  options: MailStackOptions,
  stops: (() => Promise<unknown>)[],
  stopAll: () => Promise<void>,
): Promise<MailStack> {
  const zone = testZone();
  const dns = await startDnsmasq({ records: zone.records });
  stops.push(() => dns.stop());
  const baseDir = await mkdtemp(join(tmpdir(), 'inbox-mx-'));
  stops.push(() => rm(baseDir, { recursive: true, force: true }));
  const harness = await startHarness({
    MAIL_DOMAIN,
    AUTHSERV_ID,
    DNS_SERVERS: dns.address,
    POLICY_PORT: '0',
    MILTER_PORT: '0',
    LMTP_PORT: '0',
    ...options.env,
  });
  stops.push(() => harness.close());
  const logs: LogLine[] = [];
  const logOf =
    (daemon: string): Log =>
    (line) =>
      logs.push({ daemon, ...line });
  const config: Config = harness.config;
  const running = new Map<DaemonName, { close(): Promise<unknown> }>();
  stops.push(async () => {
    for (const server of running.values()) await server.close().catch(() => undefined);
  });
  const startDaemon = async (name: DaemonName) => {
    const start = { policy: startPolicy, milter: startMilter, lmtp: startLmtp }[name];
    const server = await start(harness.container, logOf(name));
    running.set(name, server);
    // Restarts reuse the port the first start picked: Postfix's configuration names it.
    if (server.address.startsWith('inet:')) {
      config[`${name}Listen`] = { host: '127.0.0.1', port: Number(server.address.split(':').pop()) };
    }
  };
  for (const name of ['policy', 'milter', 'lmtp'] as const) await startDaemon(name);

  const smtpPort = await freePort();
  const postfix = new PostfixInstance({
    baseDir,
    render: (dirs) => renderPostfix({ ...config, smtpHost: '127.0.0.1', smtpPort }, dirs, options.postfix),
    smtp: { host: '127.0.0.1', port: smtpPort },
  });
  await postfix.prepare();
  // Stopped even when start() fails part-way (a master that came up but never listened).
  stops.push(() => postfix.stop());
  await postfix.start({ resolvConf: dns.resolvConfPath });

  const stack: MailStack = {
    ...harness,
    postfix,
    dns,
    smtpPort,
    logs,
    send: (t) => sendMail(smtpPort, { from: 'sender@allowed.test', ...t }),
    startDaemon,
    announced: () => harness.container.resolve<InboxChangeFeed>(TOKENS.InboxChangeFeed).sync(),
    async stopDaemon(name) {
      await running.get(name)?.close();
      running.delete(name);
    },
    async waitFor(what, check, timeoutMs = 20_000) {
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        const value = await check();
        if (value !== undefined) return value;
        if (Date.now() > deadline) {
          throw new Error(`timed out waiting for ${what}\n${await postfix.maillogTail(30)}`);
        }
        await sleep(100);
      }
    },
    close: stopAll,
  };
  return stack;
}

/** A plain message with CRLF line ends. */
export function plainMessage(fields: {
  from?: string;
  to: string;
  subject?: string;
  messageId?: string;
  body?: string;
  extraHeaders?: string[];
}): Buffer {
  const lines = [
    ...(fields.extraHeaders ?? []),
    `From: ${fields.from ?? 'Sender <sender@allowed.test>'}`,
    `To: ${fields.to}`,
    `Subject: ${fields.subject ?? 'hello'}`,
    `Message-ID: ${fields.messageId ?? `<${Math.random().toString(36).slice(2)}@allowed.test>`}`,
    'Date: Sat, 21 Nov 2026 12:00:00 +0000',
    'MIME-Version: 1.0',
    'Content-Type: text/plain; charset=utf-8',
    '',
    fields.body ?? 'Your code is 123456.',
    '',
  ];
  return Buffer.from(lines.join('\r\n'));
}

/**
 * A second Postfix playing the sending MTA for `stack`: it relays to the stack's SMTP port from a client
 * address with a verified name and retries deferred mail every 2 s. stop() also removes its directory.
 */
export async function startRetryingSender(stack: MailStack, name: string): Promise<SenderPostfix> {
  const runDir = await mkdtemp(join(tmpdir(), `${name}-`));
  const removeDir = () => rm(runDir, { recursive: true, force: true });
  try {
    await chmod(runDir, 0o711); // the postfix user must reach the sender's queue below it
    const sender = await startSenderPostfix({
      runDir,
      relayHost: '127.0.0.1',
      relayPort: stack.smtpPort,
      backoffSeconds: 2,
      resolvConf: stack.dns.resolvConfPath,
    });
    return { ...sender, stop: () => sender.stop().finally(removeDir) };
  } catch (error) {
    await removeDir();
    throw error;
  }
}
