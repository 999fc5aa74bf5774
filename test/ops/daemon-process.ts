/**
 * daemon-process - runs `node src/main.ts <entry>` as a child process, the production shape, on a
 * test database with every port chosen by the system (port 0), and reads its JSON log lines from
 * stdout. Used by the shutdown, probe and observability tests.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import net from 'node:net';
import { fileURLToPath } from 'node:url';
import { type Config, loadConfig } from '../../src/config/config.ts';
import { buildContainer, TOKENS } from '../../src/container.ts';
import type { InboxService, ProvisionedInbox } from '../../src/core/inbox-service.ts';
import type { LogLine } from '../../src/log.ts';
import type { Database } from '../../src/storage/database.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
export const MAIL_DOMAIN = 'ops.test';
export const SECRET_KEY = 'ops-test-secret-key-0123456789abcdefghijklmnop';

export interface DaemonProcess {
  child: ChildProcess;
  /** Every stdout line parsed as JSON (a line that is not JSON fails the test that reads it). */
  readonly lines: LogLine[];
  /** stdout and stderr as received. */
  readonly output: () => string;
  /** `http://127.0.0.1:port` of the metrics server ('' when off), `http://...` of the API (api only). */
  metricsUrl: string;
  apiUrl: string;
  /** `inet:127.0.0.1:port` of the policy daemon, milter or LMTP receiver. */
  address: string;
  port: number;
  /** The first line matching `match`, waiting for it up to timeoutMs. */
  waitForLine(match: (line: LogLine) => boolean, timeoutMs?: number): Promise<LogLine>;
  /** Sends SIGTERM; resolves with the exit code and the milliseconds until exit. */
  terminate(): Promise<{ code: number | null; ms: number }>;
  /** The exit code, once the process has exited. */
  readonly exited: Promise<number | null>;
  kill(): void;
}

export function daemonEnv(databaseUrl: string, extra: Record<string, string> = {}): Record<string, string> {
  return {
    PATH: process.env.PATH ?? '',
    ENVIRONMENT: 'dev',
    DATABASE_URL: databaseUrl,
    SECRET_KEY,
    MAIL_DOMAIN,
    API_PORT: '0',
    POLICY_PORT: '0',
    MILTER_PORT: '0',
    LMTP_PORT: '0',
    METRICS_PORT: '0',
    REQUIRE_PTR: 'false',
    ...extra,
  };
}

export async function startDaemon(entry: string, env: Record<string, string>): Promise<DaemonProcess> {
  const child = spawn(process.execPath, ['src/main.ts', entry], { cwd: ROOT, env, stdio: 'pipe' });
  const lines: LogLine[] = [];
  let output = '';
  let partial = '';
  const waiters = new Set<() => void>();
  child.stdout.setEncoding('utf8');
  child.stderr.setEncoding('utf8');
  child.stdout.on('data', (text: string) => {
    output += text;
    const parts = (partial + text).split('\n');
    partial = parts.pop() ?? '';
    for (const part of parts) lines.push(JSON.parse(part) as LogLine);
    for (const wake of waiters) wake();
  });
  child.stderr.on('data', (text: string) => {
    output += text;
  });
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  exited.then(() => {
    for (const wake of waiters) wake();
  });
  let done = false;
  void exited.then(() => {
    done = true;
  });

  const waitForLine = async (match: (line: LogLine) => boolean, timeoutMs = 15_000) => {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const found = lines.find(match);
      if (found) return found;
      if (done) throw new Error(`${entry} exited before the line came:\n${output}`);
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`${entry}: no such line within ${timeoutMs} ms:\n${output}`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        const wake = () => {
          clearTimeout(timer);
          waiters.delete(wake);
          resolve();
        };
        waiters.add(wake);
      });
    }
  };

  const listening = (key: string) => lines.find((l) => l.msg === 'listening' && typeof l[key] === 'string');
  // The metrics server starts last; with METRICS_PORT=off the entry's own line is the last.
  const last = env.METRICS_PORT === 'off' ? entry : 'metrics';
  await waitForLine(
    (l) => (l.msg === 'listening' || l.msg === 'scheduled') && typeof l[last] === 'string',
  ).catch((error: unknown) => {
    // A start that never came up is not left running behind the failed test (its pipes would keep
    // node --test waiting).
    if (!done) child.kill('SIGKILL');
    throw error;
  });
  const metrics = listening('metrics');
  const api = listening('api')?.api as string | undefined;
  const address = (listening(entry)?.[entry] as string | undefined) ?? '';
  return {
    child,
    lines,
    output: () => output,
    metricsUrl: ((metrics?.metrics as string | undefined) ?? '').replace(/\/metrics$/, ''),
    apiUrl: api ?? '',
    address,
    port: Number(address.split(':').pop()),
    waitForLine,
    async terminate() {
      const began = performance.now();
      child.kill('SIGTERM');
      const code = await exited;
      return { code, ms: Math.round(performance.now() - began) };
    },
    exited,
    kill() {
      if (!done) child.kill('SIGKILL');
    },
  };
}

/** Resolves true once `exited` settles within ms, false otherwise. */
export const exitsWithin = (daemon: DaemonProcess, ms: number): Promise<boolean> =>
  Promise.race([
    daemon.exited.then(() => true),
    new Promise<boolean>((resolve) => setTimeout(() => resolve(false), ms)),
  ]);

/** Provisions an inbox straight through the core, as `inboxctl inbox create` does. */
export async function provisionInbox(databaseUrl: string): Promise<ProvisionedInbox> {
  const config = loadConfig(daemonEnv(databaseUrl)) as Config & { secretKey: string };
  const container = buildContainer(config, { log: () => {}, poolSize: 1 });
  try {
    return (await container.resolve<InboxService>(TOKENS.InboxService).provision([])).body;
  } finally {
    await container.resolve<Database>(TOKENS.Database).close();
  }
}

/**
 * Whether new TCP connections to the port are refused within 200 ms (the listener is closed). The
 * daemon logs `stopping` a moment before it closes its listeners, so the first try may still connect.
 */
export async function refusedSoon(port: number): Promise<boolean> {
  for (let i = 0; i < 10; i++) {
    if (await refused(port)) return true;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  return false;
}

function refused(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1');
    socket.once('connect', () => {
      socket.destroy();
      resolve(false);
    });
    socket.once('error', (error: NodeJS.ErrnoException) => resolve(error.code === 'ECONNREFUSED'));
  });
}

/** One scrape of a /metrics endpoint: the value of a series, 0 when it is absent. */
export type Scrape = (name: string, labels?: Record<string, string>) => number;

export async function scrape(metricsUrl: string): Promise<Scrape> {
  const response = await fetch(`${metricsUrl}/metrics`);
  if (response.status !== 200) throw new Error(`GET /metrics answered ${response.status}`);
  if (!response.headers.get('content-type')?.startsWith('text/plain')) throw new Error('not the text format');
  const series = new Map<string, number>();
  for (const line of (await response.text()).split('\n')) {
    const match = /^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!match) continue;
    const labels = [...(match[2] ?? '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)].map((m) => [m[1], m[2]]);
    series.set(key(match[1] as string, Object.fromEntries(labels)), Number(match[3]));
  }
  return (name, labels = {}) => series.get(key(name, labels)) ?? 0;
}

function key(name: string, labels: Record<string, string>): string {
  const sorted = Object.entries(labels).sort(([a], [b]) => a.localeCompare(b));
  return `${name}{${sorted.map(([k, v]) => `${k}="${v}"`).join(',')}}`;
}
