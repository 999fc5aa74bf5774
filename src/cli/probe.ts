/**
 * probe - `node src/cli/probe.ts [--wait SECONDS] TARGET...`: is each target reachable? The container
 * stack's health checks and its start scripts' wait for the database (docker/).
 *
 * Targets:   `database` (connects to DATABASE_URL and runs `SELECT 1`), `tcp://HOST:PORT` (a TCP
 *            connection is accepted; closed at once, nothing is sent), `http://...` or `https://...` (a
 *            GET answers 2xx).
 * --wait:    retry once a second until every target answers or SECONDS have passed (default 0: one
 *            attempt each, for a health check). Each attempt is bounded by PROBE_TIMEOUT_MS.
 * Exit:      0 every target answered; 1 one did not (the reason on stderr, one line); 64 bad usage;
 *            78 bad configuration (only the `database` target reads the configuration).
 * Security:  prints no connection string, only the target's name and the error.
 */
import { connect } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { ConfigError, loadConfig } from '../config/config.ts';
import { runCli } from './run-cli.ts';

/** One attempt may take this long, so a health check never outlives Docker's timeout. */
const PROBE_TIMEOUT_MS = 3000;

const USAGE = 'usage: node src/cli/probe.ts [--wait SECONDS] database|tcp://HOST:PORT|http(s)://URL ...';

type Probe = () => Promise<void>;

function tcp(host: string, port: number): Probe {
  return () =>
    new Promise((resolve, reject) => {
      const socket = connect({ host, port, timeout: PROBE_TIMEOUT_MS });
      socket.once('connect', () => {
        socket.destroy();
        resolve();
      });
      socket.once('timeout', () => socket.destroy(new Error(`no answer within ${PROBE_TIMEOUT_MS} ms`)));
      socket.once('error', reject);
    });
}

function http(url: string): Probe {
  return async () => {
    const response = await fetch(url, { signal: AbortSignal.timeout(PROBE_TIMEOUT_MS) });
    await response.body?.cancel();
    if (response.status < 200 || response.status > 299) throw new Error(`answered ${response.status}`);
  };
}

function database(): Probe {
  const { databaseUrl } = loadConfig();
  return async () => {
    const client = new pg.Client({
      connectionString: databaseUrl,
      connectionTimeoutMillis: PROBE_TIMEOUT_MS,
    });
    client.on('error', () => {}); // a server that goes away after connecting fails the query instead
    try {
      await client.connect();
      await client.query('SELECT 1');
    } finally {
      await client.end().catch(() => {});
    }
  };
}

/** The probe for one command-line target; throws a usage Error for anything else. */
function parseTarget(target: string): Probe {
  if (target === 'database') return database();
  const tcpMatch = /^tcp:\/\/(\[[0-9a-f:.]+\]|[^:/]+):(\d{1,5})$/i.exec(target);
  if (tcpMatch?.[1] && Number(tcpMatch[2]) <= 65535) {
    return tcp(tcpMatch[1].replace(/^\[|\]$/g, ''), Number(tcpMatch[2]));
  }
  if (/^https?:\/\/[^/\s]+/.test(target)) return http(target);
  throw new Error(`unknown target "${target}"`);
}

/** Tries every target until all answer or the deadline passes; resolves with the failures left. */
async function probeAll(
  targets: Map<string, Probe>,
  waitSeconds: number,
  onWait: (line: string) => void = () => {},
): Promise<Map<string, string>> {
  const deadline = Date.now() + waitSeconds * 1000;
  let pending = new Map(targets);
  let failures = new Map<string, string>();
  for (let attempt = 0; ; attempt++) {
    failures = new Map();
    await Promise.all(
      [...pending].map(async ([name, probe]) => {
        try {
          await probe();
        } catch (error) {
          failures.set(name, error instanceof Error ? error.message || error.name : String(error));
        }
      }),
    );
    pending = new Map([...pending].filter(([name]) => failures.has(name)));
    if (pending.size === 0 || Date.now() + 1000 > deadline) return failures;
    if (attempt === 0) onWait(`probe: waiting up to ${waitSeconds} s for ${[...pending.keys()].join(', ')}`);
    await sleep(1000);
  }
}

async function main(argv: string[]): Promise<number> {
  let waitText: string;
  let positionals: string[];
  try {
    const parsed = parseArgs({ args: argv, options: { wait: { type: 'string' } }, allowPositionals: true });
    waitText = parsed.values.wait ?? '0';
    positionals = parsed.positionals;
  } catch (error) {
    process.stderr.write(`probe: ${(error as Error).message}\n${USAGE}\n`);
    return 64;
  }
  if (!/^\d+$/.test(waitText) || positionals.length === 0) {
    process.stderr.write(`${USAGE}\n`);
    return 64;
  }
  const wait = Number(waitText);
  const targets = new Map<string, Probe>();
  for (const target of positionals) {
    try {
      targets.set(target, parseTarget(target));
    } catch (error) {
      if (error instanceof ConfigError) throw error;
      process.stderr.write(`probe: ${(error as Error).message}\n${USAGE}\n`);
      return 64;
    }
  }
  const failures = await probeAll(targets, wait, (line) => process.stderr.write(`${line}\n`));
  for (const [name, reason] of failures) {
    process.stderr.write(`probe: ${name} is not reachable${wait > 0 ? ` after ${wait} s` : ''}: ${reason}\n`);
  }
  return failures.size === 0 ? 0 : 1;
}

runCli('probe', () => main(process.argv.slice(2)));
