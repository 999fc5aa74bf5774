/**
 * api-bench - `make bench-api`. Loads 1,000 inboxes of 20 messages each, then measures with wrk over
 * 50 connections: poll without cursor (limit 50), status, and a 1 MiB download; in the same run, a
 * bare Koa server answering each request with one `SELECT 1` on the same Postgres (the yardstick).
 * Prints requests/s, p99 latency, the ratio to the yardstick and the download rate, against the
 * targets of the API issue. The API runs as its own process, as in production.
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { type Config, loadConfig } from '../../src/config/config.ts';
import { buildContainer, TOKENS } from '../../src/container.ts';
import { newMessageId } from '../../src/core/ids.ts';
import type { MessageStore } from '../../src/core/ports.ts';
import type { Database } from '../../src/storage/database.ts';
import { recreateDatabase } from '../support/database.ts';

const INBOXES = 1000;
const MESSAGES_PER_INBOX = 20;
const SMALL_BYTES = 4 * 1024;
const LARGE_BYTES = 1024 * 1024;
const LARGE_INBOXES = 100; // the first 100 inboxes hold one 1 MiB message each (the download target)
const CONNECTIONS = 50;
const SECONDS = Number(process.env.BENCH_SECONDS ?? 10);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
const API_PORT = 18080;
const YARDSTICK_PORT = 18081;
const ADMIN_URL = process.env.BENCH_ADMIN_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const DB_NAME = 'inbox_bench';
const NODE = process.execPath;
const HERE = new URL('.', import.meta.url).pathname;

const dbUrl = (() => {
  const url = new URL(ADMIN_URL);
  url.pathname = `/${DB_NAME}`;
  return url.toString();
})();

const env = {
  ...process.env,
  ENVIRONMENT: 'dev',
  PROVISIONING: 'open',
  DATABASE_URL: dbUrl,
  API_PORT: String(API_PORT),
  SECRET_KEY: 'bench-secret-key-0123456789abcdefghijklmnop',
  // The limiter still runs on every request; it just never refuses.
  POLL_RATE_BURST: '1000000000',
  POLL_RATE_PER_SECOND: '1000000',
  DOWNLOAD_RATE_BURST: '1000000000',
  DOWNLOAD_RATE_PER_SECOND: '1000000',
};

function ensureWrk(): void {
  try {
    execFileSync('wrk', ['--version'], { stdio: 'ignore' });
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'ENOENT') return; // wrk --version exits 1
    process.stdout.write('installing wrk from Debian packages\n');
    execFileSync('apt-get', ['install', '-y', '-qq', 'wrk'], {
      stdio: 'inherit',
      env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' },
    });
  }
}

async function resetDatabase(): Promise<void> {
  await recreateDatabase(DB_NAME, ADMIN_URL);
}

async function startProcess(
  args: string[],
  extraEnv: Record<string, string>,
  port: number,
): Promise<ChildProcess> {
  const child = spawn(NODE, args, { env: { ...env, ...extraEnv }, stdio: ['ignore', 'ignore', 'inherit'] });
  for (let i = 0; i < 100; i++) {
    try {
      await fetch(`http://127.0.0.1:${port}/v1/health`);
      return child;
    } catch {
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  throw new Error(`${args.join(' ')} did not start`);
}

/**
 * Stands in for autovacuum between phases (the rate buckets take one update per request), so every
 * phase starts from the same state whether or not this server runs autovacuum.
 */
async function vacuum(): Promise<void> {
  const client = new pg.Client({ connectionString: dbUrl });
  await client.connect();
  await client.query('VACUUM (ANALYZE) rate_buckets, messages, inboxes');
  await client.end();
}

async function autovacuumSetting(): Promise<string> {
  const client = new pg.Client({ connectionString: dbUrl });
  await client.connect();
  const result = await client.query('SHOW autovacuum');
  await client.end();
  return String(result.rows[0]?.autovacuum);
}

async function stopProcess(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  child.kill('SIGTERM');
  await exited;
}

async function pool<T>(
  items: T[],
  concurrency: number,
  fn: (item: T, index: number) => Promise<void>,
): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < items.length) {
        const index = next++;
        await fn(items[index] as T, index);
      }
    }),
  );
}

interface Inbox {
  id: string;
  token: string;
  large?: string;
}

async function load(): Promise<Inbox[]> {
  const started = Date.now();
  const inboxes: Inbox[] = [];
  await pool(Array.from({ length: INBOXES }), 20, async () => {
    const response = await fetch(`http://127.0.0.1:${API_PORT}/v1/inboxes`, { method: 'POST', body: '{}' });
    const body = (await response.json()) as { inbox_id: string; credentials: { reader: string } };
    inboxes.push({ id: body.inbox_id, token: body.credentials.reader });
  });
  const config = loadConfig(env) as Config & { secretKey: string };
  const container = buildContainer(config, { log: () => {} });
  const messages = container.resolve<MessageStore>(TOKENS.MessageStore);
  const small = Buffer.alloc(SMALL_BYTES, 'a');
  const large = Buffer.alloc(LARGE_BYTES, 'b');
  let queue = 0;
  await pool(inboxes, 10, async (inbox, index) => {
    for (let m = 0; m < MESSAGES_PER_INBOX; m++) {
      const body = m === 0 && index < LARGE_INBOXES ? large : small;
      const queueId = `BENCH${++queue}`;
      const now = new Date();
      await messages.reserve({
        inboxId: inbox.id,
        messageId: newMessageId(),
        queueId,
        sizeBytes: body.length,
        envelopeFrom: 'bench@example.com',
        now,
      });
      const stored = await messages.store(
        {
          inboxId: inbox.id,
          queueId,
          envelopeFrom: 'bench@example.com',
          now,
          summary: {
            fromName: 'Bench',
            fromAddress: 'bench@example.com',
            subject: `message ${m}`,
            internetMessageId: `<${queueId}@example.com>`,
            authentication: null,
          },
        },
        (async function* () {
          for (let i = 0; i < body.length; i += 64 * 1024) yield body.subarray(i, i + 64 * 1024);
        })(),
      );
      if (body === large) inbox.large = stored.messageId;
    }
  });
  await container.resolve<Database>(TOKENS.Database).close();
  process.stdout.write(
    `loaded ${INBOXES} inboxes x ${MESSAGES_PER_INBOX} messages in ${((Date.now() - started) / 1000).toFixed(1)} s\n`,
  );
  return inboxes;
}

interface Result {
  rps: number;
  p50ms: number;
  p99ms: number;
  mbps: number;
  failures: number;
}

function wrk(port: number, lines: string[], seconds = SECONDS): Result {
  const file = join(tmpdir(), `bench-targets-${port}-${lines.length}.txt`);
  writeFileSync(file, `${lines.join('\n')}\n`);
  const out = execFileSync(
    'wrk',
    [
      '-t',
      '2',
      '-c',
      String(CONNECTIONS),
      '-d',
      `${seconds}s`,
      '-s',
      join(HERE, 'wrk-targets.lua'),
      `http://127.0.0.1:${port}`,
      '--',
      file,
    ],
    { encoding: 'utf8' },
  );
  const line = out.split('\n').find((l) => l.startsWith('RESULT '));
  if (!line) throw new Error(`no result from wrk:\n${out}`);
  const r = JSON.parse(line.slice(7)) as Record<string, number>;
  const secs = (r.duration_us as number) / 1e6;
  return {
    rps: (r.requests as number) / secs,
    p50ms: (r.p50_us as number) / 1000,
    p99ms: (r.p99_us as number) / 1000,
    mbps: (r.bytes as number) / secs / 1e6,
    failures: (r.socket_errors as number) + (r.non2xx as number),
  };
}

async function main(): Promise<void> {
  ensureWrk();
  await resetDatabase();
  const loader = await startProcess([join(HERE, '../../src/main.ts'), 'api'], {}, API_PORT);
  const children: ChildProcess[] = [loader];
  try {
    const inboxes = await load();
    // The measured API process starts on the loaded, analyzed database, as a long-running one would be
    // after autovacuum's next ANALYZE: its generic plans are made from real statistics.
    await stopProcess(loader);
    const api = await startProcess([join(HERE, '../../src/main.ts'), 'api'], {}, API_PORT);
    children.push(api);
    const poll = inboxes.map((i) => `/v1/inboxes/${i.id}/messages?limit=50 ${i.token}`);
    const status = inboxes.map((i) => `/v1/inboxes/${i.id} ${i.token}`);
    const download = inboxes
      .filter((i) => i.large)
      .map((i) => `/v1/inboxes/${i.id}/messages/${i.large} ${i.token}`);
    const yardstick = await startProcess(
      [join(HERE, 'yardstick-server.ts')],
      { PORT: String(YARDSTICK_PORT) },
      YARDSTICK_PORT,
    );
    children.push(yardstick);
    // Rounds alternate the yardstick and the endpoints, so a slow moment of the machine hits both; each
    // figure is the median over the rounds. Every run follows a short warm-up on the same targets (the
    // JIT, every pool connection's prepared statements) and a vacuum (see vacuum()).
    const measure = async (port: number, targets: string[]) => {
      await vacuum();
      wrk(port, targets, 3);
      return wrk(port, targets);
    };
    const runs: Record<'yardstick' | 'poll' | 'status' | 'download', Result[]> = {
      yardstick: [],
      poll: [],
      status: [],
      download: [],
    };
    for (let round = 1; round <= ROUNDS; round++) {
      runs.yardstick.push(await measure(YARDSTICK_PORT, ['/ none']));
      runs.poll.push(await measure(API_PORT, poll));
      runs.status.push(await measure(API_PORT, status));
      runs.download.push(await measure(API_PORT, download));
      process.stdout.write(
        `round ${round}: ${Object.entries(runs)
          .map(([k, v]) => `${k} ${v[round - 1]?.rps.toFixed(0)}/s`)
          .join(', ')}\n`,
      );
    }
    const base = median(runs.yardstick);
    const results = { poll: median(runs.poll), status: median(runs.status), download: median(runs.download) };
    const fmt = (n: number, d = 0) => n.toFixed(d);
    const row = (name: string, r: Result, target: string, met: boolean) => [
      name,
      fmt(r.rps),
      fmt(r.rps / base.rps, 2),
      fmt(r.p99ms, 1),
      target,
      target ? pass(met) : '',
      String(r.failures),
    ];
    const { poll: p, status: s, download: d } = results;
    const rows = [
      row('yardstick (Koa + SELECT 1)', base, '', true),
      row('poll (limit 50, 20 messages)', p, '>= 0.20, p99 < 25 ms', p.rps / base.rps >= 0.2 && p.p99ms < 25),
      row('status', s, '>= 0.33, p99 < 25 ms', s.rps / base.rps >= 0.33 && s.p99ms < 25),
      row('download 1 MiB', d, `${fmt(d.mbps)} MB/s >= 200 MB/s`, d.mbps >= 200),
    ];
    const header = ['endpoint', 'req/s', 'ratio', 'p99 ms', 'target', 'met', 'failed requests'];
    process.stdout.write(
      `\n${CONNECTIONS} connections, ${SECONDS} s runs after a 3 s warm-up, median of ${ROUNDS} rounds, wrk -t 2; server autovacuum=${await autovacuumSetting()} (the bench vacuums before each run)\n`,
    );
    for (const row of [header, ...rows])
      process.stdout.write(`${row.map((c, i) => c.padEnd(i === 0 ? 30 : 12)).join(' ')}\n`);
  } finally {
    for (const child of children) child.kill('SIGTERM');
  }
}

const pass = (ok: boolean) => (ok ? 'yes' : 'NO');

/** The run with the median rate (its own p99 and transfer rate go with it). */
function median(results: Result[]): Result {
  const sorted = [...results].sort((a, b) => a.rps - b.rps);
  return sorted[Math.floor(sorted.length / 2)] as Result;
}

main().catch((error: unknown) => {
  process.stderr.write(`${error instanceof Error ? error.stack : String(error)}\n`);
  process.exit(1);
});
