/**
 * dnsmasq - a private DNS server for tests: fake sender domains, PTR records and a PTR that times out,
 * with no internet and without touching the host's /etc/resolv.conf (MAIL-FACTS F.1).
 *
 * startDnsmasq() writes dnsmasq.conf, a resolv.conf (for Postfix's bind mount) and a query log into a
 * fresh temporary directory, runs `dnsmasq --keep-in-foreground` as a child on <address>:53 (a random
 * free 127.x.y.z unless one is given; another address is tried when the bind fails) and resolves once
 * the server answers. PTR queries listed in `ptrTimeout` are forwarded to a UDP socket of ours that
 * never answers, so resolvers see a timeout, not an answer. Names under `localDomains` that have no
 * record are NXDOMAIN, and so is every reverse name without a PTR. Needs root (port 53). stop() kills
 * the child, closes the black hole and removes the directory; it is safe to call twice.
 */

import { type ChildProcess, spawn } from 'node:child_process';
import { createSocket, type Socket } from 'node:dgram';
import { Resolver } from 'node:dns/promises';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { reverseName } from '../../src/mail/dns.ts';

export interface DnsRecords {
  /** TXT: name → one string (split into 255-byte pieces as needed) or the pieces themselves. */
  txt?: Record<string, string | string[]>;
  /** A: name → IPv4 address (no PTR is implied). */
  a?: Record<string, string>;
  /** PTR: IPv4 address → name. */
  ptr?: Record<string, string>;
  /** IPv4 addresses whose PTR query is never answered (a resolver timeout). */
  ptrTimeout?: string[];
  /** Domains answered only from these records: anything else under them is NXDOMAIN. Default ['test']. */
  localDomains?: string[];
}

export interface Dnsmasq {
  address: string;
  /** `nameserver <address>` with a 1 s timeout and one attempt, for bind-mounting over /etc/resolv.conf. */
  resolvConfPath: string;
  logFile: string;
  stop(): Promise<void>;
}

/** One TXT value as dnsmasq's quoted character-strings of at most 255 bytes each. */
function txtStrings(value: string | string[]): string {
  const pieces = typeof value === 'string' ? (value.match(/[\s\S]{1,255}/g) ?? ['']) : value;
  return pieces
    .map((piece) => {
      if (Buffer.byteLength(piece) > 255) throw new Error(`TXT piece longer than 255 bytes: ${piece}`);
      return `"${piece.replace(/["\\]/g, '\\$&')}"`;
    })
    .join(',');
}

export function dnsmasqConf(address: string, records: DnsRecords, blackHole: { port: number }): string {
  const lines = [
    'port=53',
    `listen-address=${address}`,
    'bind-interfaces',
    'no-resolv',
    'no-hosts',
    'no-poll',
    'bogus-priv',
    'log-queries',
    'pid-file=',
    'local=/in-addr.arpa/',
  ];
  for (const domain of records.localDomains ?? ['test']) lines.push(`local=/${domain}/`);
  for (const [name, value] of Object.entries(records.txt ?? {}))
    lines.push(`txt-record=${name},${txtStrings(value)}`);
  for (const [name, ip] of Object.entries(records.a ?? {})) lines.push(`address=/${name}/${ip}`);
  for (const [ip, name] of Object.entries(records.ptr ?? {}))
    lines.push(`ptr-record=${reverseName(ip)},${name}`);
  for (const ip of records.ptrTimeout ?? []) {
    lines.push(`server=/${reverseName(ip)}/${address}#${blackHole.port}`);
  }
  return `${lines.join('\n')}\n`;
}

function randomAddress(): string {
  const byte = () => 1 + Math.floor(Math.random() * 254);
  return `127.${100 + Math.floor(Math.random() * 100)}.${byte()}.${byte()}`;
}

async function answers(address: string): Promise<boolean> {
  const resolver = new Resolver({ timeout: 300, tries: 1 });
  resolver.setServers([address]);
  try {
    await resolver.resolveTxt('dnsmasq-ready.invalid');
    return true;
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    return code === 'ENOTFOUND' || code === 'ENODATA' || code === 'EREFUSED';
  }
}

/** Starts dnsmasq with these records; rejects with dnsmasq's own message if it cannot start. */
export async function startDnsmasq(options: { address?: string; records: DnsRecords }): Promise<Dnsmasq> {
  const dir = await mkdtemp(join(tmpdir(), 'dnsmasq-'));
  let lastError = '';
  for (let attempt = 0; attempt < (options.address ? 1 : 5); attempt++) {
    const address = options.address ?? randomAddress();
    const blackHole: Socket = createSocket('udp4');
    await new Promise<void>((done) => blackHole.bind(0, address, done));
    blackHole.on('message', () => {}); // read and never answer
    const confPath = join(dir, 'dnsmasq.conf');
    const logFile = join(dir, 'dnsmasq.log');
    await writeFile(
      confPath,
      `${dnsmasqConf(address, options.records, blackHole.address())}log-facility=${logFile}\n`,
    );
    const resolvConfPath = join(dir, 'resolv.conf');
    await writeFile(resolvConfPath, `nameserver ${address}\noptions timeout:1 attempts:1\n`);
    const child: ChildProcess = spawn('dnsmasq', ['--keep-in-foreground', `--conf-file=${confPath}`], {
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let stderr = '';
    child.stderr?.on('data', (chunk) => {
      stderr += String(chunk);
    });
    let exited = false;
    const exit = new Promise<void>((done) => {
      child.on('error', (error) => {
        stderr += String(error);
        exited = true;
        done();
      });
      child.on('exit', () => {
        exited = true;
        done();
      });
    });
    const deadline = Date.now() + 5000;
    while (!exited && Date.now() < deadline && !(await answers(address))) await sleep(50);
    if (!exited && (await answers(address))) {
      let stopped = false;
      return {
        address,
        resolvConfPath,
        logFile,
        async stop() {
          if (stopped) return;
          stopped = true;
          if (!exited) {
            child.kill('SIGTERM');
            await Promise.race([exit, sleep(3000, undefined, { ref: false })]);
            if (!exited) child.kill('SIGKILL');
          }
          blackHole.close();
          await rm(dir, { recursive: true, force: true });
        },
      };
    }
    if (!exited) child.kill('SIGKILL');
    await exit;
    blackHole.close();
    lastError = stderr.trim() || 'no answer within 5 s';
  }
  await rm(dir, { recursive: true, force: true });
  throw new Error(`dnsmasq did not start: ${lastError}`);
}
