/**
 * main - the one binary: `node src/main.ts api | policy | milter | lmtp | jobs | migrate | all`.
 *
 * `all` migrates, runs every daemon and the lifecycle jobs in one process and starts a private Postfix
 * instance under RUN_DIR/postfix listening on SMTP_HOST:SMTP_PORT (the small install `make run` uses);
 * Postfix's log is followed onto stdout. Configuration comes from the environment only; a bad value
 * stops the process naming the variable (exit 78).
 *
 * Each entry loads only the modules it runs (dynamic imports below): a daemon's heap is what its own
 * collections have to walk. The entries that move message bytes first re-execute themselves with
 * their V8 heap flags (src/heap-flags.ts; same pid).
 *
 * Every entry but migrate also serves /metrics, /livez and /readyz on METRICS_HOST:METRICS_PORT
 * (src/ops/ops-server.ts), started once its daemons listen. Logs are JSON lines on stdout (src/log.ts).
 *
 * SIGTERM or SIGINT: readiness turns 503 at once; Postfix stops first (`all`), then every daemon at
 * once stops accepting and finishes what it has in flight for up to SHUTDOWN_GRACE_SECONDS (see each
 * daemon's header; the job schedule stops after its current batch); then the pool and the metrics
 * server close and the process exits 0. Should that take more than the grace plus 10 s, or a second
 * signal come, the process exits 1 at once.
 */
import { dirname } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { DependencyContainer } from 'tsyringe';
import { type Config, ConfigError, type Listen, loadConfig } from './config/config.ts';
import { ensureSecretKey } from './config/secret-key.ts';
import { buildContainer, TOKENS } from './container.ts';
import { CheckedClock, watchClock } from './core/clock-check.ts';
import { applyHeapFlags } from './heap-flags.ts';
import { createLog, type Log } from './log.ts';
import type { Health } from './ops/health.ts';
import type { Metrics } from './ops/metrics.ts';
import { DEFAULT_METRICS_PORTS, startOpsServer } from './ops/ops-server.ts';
import { lockRunDir, RunDirBusy } from './ops/run-lock.ts';
import type { Database } from './storage/database.ts';

const ENTRIES = ['api', 'policy', 'milter', 'lmtp', 'jobs', 'migrate', 'all'] as const;
type Entry = (typeof ENTRIES)[number];

/** A TCP listen with the port actually bound (port 0 picks one); a socket path as it was. */
const boundListen = (listen: Listen, port: number | undefined): Listen =>
  'port' in listen && port !== undefined ? { ...listen, port } : listen;

/** The mail daemons, in start order: each listens where its setting says, and Postfix is told where. */
type Listener = {
  close(): Promise<unknown>;
  port?: number | undefined;
  address: string;
};
const LISTENERS: readonly [
  'policy' | 'milter' | 'lmtp',
  'policyListen' | 'milterListen' | 'lmtpListen',
  (container: DependencyContainer, log: Log) => Promise<Listener>,
][] = [
  ['policy', 'policyListen', async (c, l) => (await import('./daemons/policy.ts')).startPolicy(c, l)],
  ['milter', 'milterListen', async (c, l) => (await import('./daemons/milter.ts')).startMilter(c, l)],
  ['lmtp', 'lmtpListen', async (c, l) => (await import('./daemons/lmtp.ts')).startLmtp(c, l)],
];

interface Running {
  name: string;
  close(): Promise<unknown>;
}

async function main(argv: string[]): Promise<void> {
  const entry = (argv[0] ?? 'all') as Entry;
  if (!ENTRIES.includes(entry)) {
    process.stderr.write(`usage: node src/main.ts ${ENTRIES.join(' | ')}\n`);
    process.exit(64);
  }
  const loaded = loadConfig();
  // Before anything else starts: this may replace the process (same pid) with one that has the flags.
  applyHeapFlags(entry, loaded.heapFlags === 'on');
  const config = await ensureSecretKey(loaded);
  const logOf = (daemon: string) => createLog(daemon, undefined, config.logLevel);
  const log = logOf(entry);
  // Before anything binds or migrates: a second `make run` of this checkout stops here, naming the first.
  const lock = entry === 'all' ? await lockRunDir(config.runDir) : undefined;
  if (entry === 'migrate' || entry === 'all') {
    const { migrate } = await import('./storage/migrate.ts');
    const applied = await migrate(config.databaseUrl);
    log({ msg: 'migrated', applied });
    if (entry === 'migrate') return;
  }
  const all = entry === 'all';
  // Every daemon tells the time only while it agrees with PostgreSQL's (core/clock-check.ts): the mail
  // daemons then defer mail, the API answers 500 (and is not ready), the jobs' runs fail.
  const clock = new CheckedClock();
  const container = buildContainer(config, {
    log: logOf(all ? 'service' : entry),
    poolSize: all ? 20 : 10,
    clock,
  });
  const health = container.resolve<Health>(TOKENS.Health);
  const database = container.resolve<Database>(TOKENS.Database);
  const clockWatch = watchClock(clock, () => database.clockMs(), log);
  health.watch('clock', () => clock.skewed ?? 'ok');
  const graceMs = config.shutdownGraceSeconds * 1000;
  const running: Running[] = [];
  let ops: Running | undefined;
  // From the moment stopping begins, whatever it waits for (a start step that hangs included).
  let exitTimer: NodeJS.Timeout | undefined;
  const exitAtTheLatest = () => {
    exitTimer ??= setTimeout(() => {
      log({ level: 'error', msg: 'stopping took too long; exiting now' });
      process.exit(1);
    }, graceMs + 10_000);
    exitTimer.unref();
  };
  const shutdown = async () => {
    health.stop();
    exitAtTheLatest();
    // Postfix first, so no new delivery starts; then every daemon at once finishes what it has in
    // flight, each within the one grace (one after another, under `all` their graces added up past
    // the exit deadline: ops review).
    const closeOne = async (item: Running) => {
      const started = performance.now();
      await item
        .close()
        .catch((error: unknown) =>
          log({ level: 'error', msg: 'stop failed', name: item.name, error: String(error) }),
        );
      log({ msg: 'stopped', name: item.name, ms: Math.round(performance.now() - started) });
    };
    for (const item of running.filter((r) => r.name === 'postfix')) await closeOne(item);
    await Promise.all(running.filter((r) => r.name !== 'postfix').map(closeOne));
    clockWatch.stop();
    await database.close();
    await ops?.close();
    await lock?.release();
  };
  // The start sequence below; a signal during it lets it reach its next step, then unwinds it all.
  let startup: Promise<void> | undefined;
  const stop = async (signal: string) => {
    const began = performance.now();
    log({ msg: 'stopping', signal, grace_seconds: config.shutdownGraceSeconds });
    health.stop();
    exitAtTheLatest();
    await startup?.catch(() => {});
    await shutdown();
    log({ msg: 'stopped', ms: Math.round(performance.now() - began) });
    process.exit(0);
  };
  let stopping = false;
  const onSignal = (signal: string) => {
    if (!stopping) {
      stopping = true;
      void stop(signal);
      return;
    }
    log({ level: 'warn', msg: 'second signal; exiting now', signal });
    process.exit(1);
  };
  process.on('SIGTERM', onSignal);
  process.on('SIGINT', onSignal);

  const bound: Partial<Pick<Config, 'policyListen' | 'milterListen' | 'lmtpListen'>> = {};
  /** Ends the start sequence early once a signal came (what started is in `running`). */
  const checkpoint = () => {
    if (stopping) throw new Error('stopping: start abandoned');
  };
  startup = (async () => {
    // The first clock reading before any mail is taken (at most 5 s: with PostgreSQL away, the
    // daemons' own database errors answer 4xx meanwhile, and the reading is taken again every 30 s).
    await Promise.race([clockWatch.first, sleep(5_000, undefined, { ref: false })]);
    checkpoint();
    for (const [name, listen, start] of LISTENERS) {
      if (entry !== name && !all) continue;
      const server = await start(container, logOf(name));
      running.push({ name, close: () => server.close() });
      bound[listen] = boundListen(config[listen], server.port);
      log({ msg: 'listening', [name]: server.address });
      checkpoint();
    }
    if (entry === 'jobs' || all) {
      const { startJobs } = await import('./daemons/jobs.ts');
      const schedule = startJobs(container, logOf('jobs'));
      running.push({ name: 'jobs', close: () => schedule.close() });
      log({ msg: 'scheduled', jobs: `every ${config.sweepIntervalSeconds} s` });
    }
    checkpoint();
    if (all) {
      const { PostfixInstance } = await import('./postfix/instance.ts');
      const { followMaillog } = await import('./postfix/follow-maillog.ts');
      // Postfix is told the ports the daemons bound (port 0 picks one).
      const postfix = PostfixInstance.forService({ ...config, ...bound });
      await postfix.stop(); // a master left running by a previous run that was killed
      await postfix.prepare();
      if (postfix.moved) {
        log({
          level: 'warn',
          msg: 'Postfix lives outside RUN_DIR',
          postfix_dir: dirname(postfix.dirs.queueDirectory),
          linked_from: postfix.moved.from,
          because: postfix.moved.because,
        });
      }
      const following = followMaillog(postfix.dirs.maillogFile, logOf('postfix'));
      // Registered before it starts: a start that fails part way stops what it started.
      running.push({
        name: 'postfix',
        close: async () => {
          await postfix.stop();
          following.stop();
        },
      });
      checkpoint();
      await postfix.start();
      // A master that dies (killed, out of memory) leaves no SMTP listener: not ready, and logged.
      health.watch('postfix', () => (postfix.masterPid() === undefined ? 'not running' : 'ok'));
      log({
        msg: 'listening',
        smtp: `${postfix.smtp.host}:${postfix.smtp.port}`,
        mail_domain: config.mailDomain,
      });
    }
    checkpoint();
    // The API last: with `all` (make run), once it answers, Postfix already takes mail for its inboxes.
    if (entry === 'api' || all) {
      const { startApi } = await import('./daemons/api.ts');
      const api = await startApi(container, graceMs);
      running.push({ name: 'api', close: () => api.close() });
      log({ msg: 'listening', api: api.url, public_base_url: config.publicBaseUrl });
    }
    checkpoint();
    const metricsPort = config.metricsPort ?? DEFAULT_METRICS_PORTS[entry] ?? 9464;
    if (metricsPort !== 'off') {
      const server = await startOpsServer({
        host: config.metricsHost,
        port: metricsPort,
        metrics: container.resolve<Metrics>(TOKENS.Metrics),
        health,
        log,
      });
      ops = { name: 'metrics', close: () => server.close() };
      log({
        msg: 'listening',
        metrics: `${server.url}/metrics`,
        probes: [`${server.url}/livez`, `${server.url}/readyz`],
      });
    }
  })();
  try {
    await startup;
  } catch (error) {
    if (stopping) return; // a signal came: its stop() unwinds what started, and exits
    // Nothing half started stays behind (a Postfix master tempfailing every sender, a bound port).
    log({ level: 'error', msg: 'start failed; stopping what started', error: String(error) });
    stopping = true;
    await shutdown();
    throw error;
  }
}

main(process.argv.slice(2)).catch((error: unknown) => {
  if (error instanceof ConfigError) {
    process.stderr.write(`configuration error: ${error.message}\n`);
    process.exit(78);
  }
  if (error instanceof RunDirBusy) {
    process.stderr.write(`${error.message}\n`);
    process.exit(75);
  }
  process.stderr.write(`fatal: ${error instanceof Error ? error.stack : String(error)}\n`);
  process.exit(1);
});
