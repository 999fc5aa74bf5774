/**
 * policy-bench - `node test/bench/policy-bench.ts`. Measures our policy daemon (policy-target.ts)
 * against postgrey, the usual Postfix policy daemon, under the same RCPT-stage load (policy-load.ts,
 * run as its own process) and prints requests/s, p50 and p99 latency, and the ratio ours/postgrey
 * against the target of 1.5.
 *
 * postgrey (Debian's /usr/sbin/postgrey, Perl, one Net::Server::Multiplex process) runs in the
 * foreground on a free loopback port with a fresh temporary --dbdir, its default delay and whitelists,
 * and -q: it logs no line per request, as ours does not. Every request is a new triplet, so each one
 * is an insert into its BerkeleyDB and answers DEFER_IF_PERMIT (greylisted).
 *
 * Environment: BENCH_CONNECTIONS (20), BENCH_SECONDS (10), BENCH_WARMUP_SECONDS (3), BENCH_ROUNDS (3),
 * POSTGREY (/usr/sbin/postgrey). Rounds alternate the targets, so a slow moment of the machine hits
 * both; each figure is the median round.
 */
import { execFileSync, spawn } from 'node:child_process';
import { chownSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { freePort } from '../support/sender-postfix.ts';
import type { LoadConfig, LoadResult } from './policy-load.ts';
import { type BenchTarget, startTarget } from './policy-target.ts';
import { waitListening } from './wait-listening.ts';

const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 20);
const SECONDS = Number(process.env.BENCH_SECONDS ?? 10);
const WARMUP_SECONDS = Number(process.env.BENCH_WARMUP_SECONDS ?? 3);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
const POSTGREY = process.env.POSTGREY ?? '/usr/sbin/postgrey';
const TARGET_RATIO = 1.5;
const HERE = new URL('.', import.meta.url).pathname;

/** postgrey drops root privileges to --user, so its dbdir must belong to that user. */
async function startPostgrey(): Promise<BenchTarget> {
  const port = await freePort();
  const dbdir = mkdtempSync(join(tmpdir(), 'postgrey-bench-'));
  const root = process.getuid?.() === 0;
  const user = root ? 'postgrey' : execFileSync('id', ['-un'], { encoding: 'utf8' }).trim();
  const group = root ? 'postgrey' : execFileSync('id', ['-gn'], { encoding: 'utf8' }).trim();
  if (root) {
    const uid = Number(execFileSync('id', ['-u', user], { encoding: 'utf8' }));
    const gid = Number(execFileSync('id', ['-g', user], { encoding: 'utf8' }));
    chownSync(dbdir, uid, gid);
  }
  const child = spawn(
    POSTGREY,
    [`--inet=127.0.0.1:${port}`, `--dbdir=${dbdir}`, `--user=${user}`, `--group=${group}`, '-q'],
    { stdio: ['ignore', 'ignore', 'inherit'] },
  );
  await waitListening('postgrey', port, child);
  return {
    name: 'postgrey',
    host: '127.0.0.1',
    port,
    async stop() {
      if (child.exitCode === null) {
        const exited = new Promise((r) => child.once('exit', r));
        child.kill('SIGTERM');
        await exited;
      }
      rmSync(dbdir, { recursive: true, force: true });
    },
  };
}

async function load(target: BenchTarget): Promise<LoadResult> {
  const config: LoadConfig = {
    host: target.host,
    port: target.port,
    connections: CONNECTIONS,
    warmupSeconds: WARMUP_SECONDS,
    seconds: SECONDS,
    ...(target.recipients ? { recipients: target.recipients } : {}),
  };
  const child = spawn(process.execPath, [join(HERE, 'policy-load.ts')], {
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  let out = '';
  child.stdout.setEncoding('utf8').on('data', (text: string) => {
    out += text;
  });
  child.stdin.end(JSON.stringify(config));
  const code = await new Promise((r) => child.once('exit', r));
  if (code !== 0) throw new Error(`policy-load exited with ${code}`);
  return JSON.parse(out) as LoadResult;
}

/** The run with the median rate (its own latencies go with it). */
function median(results: LoadResult[]): LoadResult {
  const sorted = [...results].sort((a, b) => a.rps - b.rps);
  return sorted[Math.floor(sorted.length / 2)] as LoadResult;
}

async function main(): Promise<void> {
  const targets = [await startPostgrey(), await startTarget()];
  try {
    const runs = targets.map(() => [] as LoadResult[]);
    for (let round = 1; round <= ROUNDS; round++) {
      for (const [i, target] of targets.entries()) runs[i]?.push(await load(target));
      const rates = targets.map((t, i) => `${t.name} ${runs[i]?.[round - 1]?.rps.toFixed(0)}/s`);
      process.stdout.write(`round ${round}: ${rates.join(', ')}\n`);
    }
    const [theirs, ours] = runs.map(median) as [LoadResult, LoadResult];
    const ratio = ours.rps / theirs.rps;
    process.stdout.write(
      `\n${CONNECTIONS} connections, one request at a time each, ${SECONDS} s runs after a ${WARMUP_SECONDS} s warm-up, median of ${ROUNDS} rounds\n`,
    );
    const rows = [
      ['target', 'req/s', 'p50 ms', 'p99 ms', 'errors', 'replies'],
      ...targets.map((t, i) => {
        const r = i === 0 ? theirs : ours;
        const replies = Object.entries(r.actions).map(([action, n]) => `${action} ${n}`);
        return [
          t.name,
          r.rps.toFixed(0),
          r.p50ms.toFixed(2),
          r.p99ms.toFixed(2),
          String(r.errors),
          replies.join(', '),
        ];
      }),
    ];
    for (const row of rows)
      process.stdout.write(`${row.map((c, i) => c.padEnd(i === 0 ? 28 : 10)).join(' ')}\n`);
    const met = ratio >= TARGET_RATIO ? 'met' : 'NOT MET';
    process.stdout.write(`\nratio ours/postgrey: ${ratio.toFixed(2)} (target >= ${TARGET_RATIO}: ${met})\n`);
  } finally {
    for (const target of targets) await target.stop();
  }
}

main().catch((error: unknown) => {
  process.stderr.write(`${error instanceof Error ? error.stack : String(error)}\n`);
  process.exit(1);
});
