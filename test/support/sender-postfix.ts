/**
 * sender-postfix - a second, sending Postfix for tests: "a real retrying sender" (MAIL-FACTS F.4).
 *
 * Its smtpd listens on a free 127.0.0.1 port and takes mail for any domain from 127.0.0.0/8; its
 * queue relays everything to relayHost:relayPort (bracketed: no MX or A lookup) from bindAddress, so
 * the MX under test sees that source address, HELO heloName, and retries deferred mail after
 * backoffSeconds (queue_run_delay, minimal and maximal backoff) instead of Postfix's 5 minutes.
 * Lives in its own directory under runDir (etc/, queue/, data/, maillog) with its own master, so it
 * runs beside the instance under test. Needs root like any Postfix. Call stop() in a finally/after
 * hook; it is idempotent.
 */
import { readFileSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { join } from 'node:path';
import { PostfixInstance } from '../../src/postfix/instance.ts';
import { applyOverrides, fillTemplate, readTemplate } from '../../src/postfix/render.ts';

export interface SenderPostfixOptions {
  runDir: string;
  relayHost: string;
  relayPort: number;
  /** Retry interval for deferred mail, in seconds (default 2). */
  backoffSeconds?: number;
  /** Source address of its SMTP client (default 127.0.0.3, which has a forward-confirmed PTR). */
  bindAddress?: string;
  /** HELO name and myhostname (default mail.sender.test). */
  heloName?: string;
  /** Extra main.cf parameters. */
  overrides?: Record<string, string>;
  /** Bind-mounted over /etc/resolv.conf for this instance only. */
  resolvConf?: string;
}

export interface SenderPostfix {
  instance: PostfixInstance;
  /** Where to inject mail (swaks --server/--port, or any SMTP client). */
  host: string;
  port: number;
  stop(): Promise<void>;
}

export async function freePort(host = '127.0.0.1'): Promise<number> {
  const [port] = await freePorts(1, host);
  return port as number;
}

/** Below the kernel's ephemeral range (net.ipv4.ip_local_port_range; Linux's default starts at 32768). */
const HIGH_PORT = ephemeralStart() - 1;
const LOW_PORT = Math.max(1024, HIGH_PORT - 12_000);

function ephemeralStart(): number {
  try {
    const low = Number(readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]);
    return low > 2048 ? low : 32_768;
  } catch {
    return 32_768;
  }
}

/**
 * `count` distinct free ports: every probe stays bound until all have their port. They are drawn below
 * the kernel's ephemeral range (32768-60999 here), from which port-0 listeners and every outgoing
 * connection take theirs: a port from that range, free when probed, was now and then taken before the
 * process it was meant for bound it (Postfix: "bind 127.0.0.1 port 43875: Address already in use").
 */
export async function freePorts(count: number, host = '127.0.0.1'): Promise<number[]> {
  const servers: Server[] = [];
  try {
    const ports: number[] = [];
    for (let tries = 0; ports.length < count; tries++) {
      if (tries > 1000) throw new Error(`no ${count} free ports between ${LOW_PORT} and ${HIGH_PORT}`);
      const port = LOW_PORT + Math.floor(Math.random() * (HIGH_PORT - LOW_PORT + 1));
      if (ports.includes(port)) continue;
      const server = createServer();
      const bound = await new Promise<boolean>((done) => {
        server.once('error', () => done(false));
        server.listen(port, host, () => done(true));
      });
      if (!bound) continue;
      servers.push(server);
      ports.push(port);
    }
    return ports;
  } finally {
    await Promise.all(servers.map((server) => new Promise<void>((done) => server.close(() => done()))));
  }
}

export function senderMainCf(
  options: SenderPostfixOptions,
  dirs: { queueDirectory: string; dataDirectory: string; maillogFile: string },
): string {
  const backoff = options.backoffSeconds ?? 2;
  const relay = `[${options.relayHost}]:${options.relayPort}`;
  const lines = [
    '# main.cf of the sending test Postfix (test/support/sender-postfix.ts)',
    'compatibility_level = 3.6',
    `queue_directory = ${dirs.queueDirectory}`,
    `data_directory = ${dirs.dataDirectory}`,
    'syslog_name = postfix-sender',
    `maillog_file = ${dirs.maillogFile}`,
    `maillog_file_prefixes = ${join(dirs.maillogFile, '..')}`,
    `myhostname = ${options.heloName ?? 'mail.sender.test'}`,
    'inet_interfaces = 127.0.0.1',
    'inet_protocols = ipv4',
    'mynetworks = 127.0.0.0/8',
    'mydestination =',
    'relay_domains =',
    'alias_maps =',
    'alias_database =',
    'smtpd_relay_restrictions = permit_mynetworks, reject',
    'smtpd_recipient_restrictions =',
    'message_size_limit = 104857600',
    'mailbox_size_limit = 0',
    'virtual_mailbox_limit = 0',
    'enable_long_queue_ids = yes',
    `relayhost = ${relay}`,
    // Bounces and double bounces (null sender) are dropped here, never relayed back to the MX.
    'sender_dependent_default_transport_maps = inline:{ { <> = discard:test sender sends no bounces } }',
    `smtp_bind_address = ${options.bindAddress ?? '127.0.0.3'}`,
    'smtp_connection_cache_on_demand = no',
    'smtp_tls_security_level = none',
    `queue_run_delay = ${backoff}s`,
    `minimal_backoff_time = ${backoff}s`,
    `maximal_backoff_time = ${backoff}s`,
    'maximal_queue_lifetime = 1h',
    'bounce_queue_lifetime = 0',
    'delay_warning_time = 0',
    'notify_classes =',
  ];
  return applyOverrides(`${lines.join('\n')}\n`, options.overrides ?? {});
}

/** Prepares and starts the sender; on failure nothing is left running. */
export async function startSenderPostfix(options: SenderPostfixOptions): Promise<SenderPostfix> {
  const port = await freePort();
  const instance = new PostfixInstance({
    baseDir: join(options.runDir, 'sender-postfix'),
    render: (dirs) => ({
      mainCf: senderMainCf(options, dirs),
      masterCf: fillTemplate('postfix/master.cf', readTemplate('master.cf'), {
        SMTP_LISTEN: `127.0.0.1:${port}`,
      }),
    }),
    smtp: { host: '127.0.0.1', port },
  });
  try {
    await instance.prepare();
    await instance.start(options.resolvConf ? { resolvConf: options.resolvConf } : {});
  } catch (error) {
    await instance.stop();
    throw error;
  }
  return { instance, host: '127.0.0.1', port, stop: () => instance.stop() };
}
