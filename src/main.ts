/**
 * main - the one binary: `node src/main.ts api | policy | milter | lmtp | jobs | migrate | all`.
 *
 * `all` migrates, runs every daemon and the lifecycle jobs in one process and starts a private Postfix
 * instance under RUN_DIR/postfix listening on SMTP_HOST:SMTP_PORT (the small install `make run` uses);
 * Postfix's log is followed onto stdout. Configuration comes from the environment only; a bad value
 * stops the process naming the variable. SIGTERM or SIGINT stops Postfix first, then the daemons and the
 * job schedule (a sweep in progress stops after its current batch), then closes the pool.
 */
import { ConfigError, loadConfig } from './config/config.ts';
import { ensureSecretKey } from './config/secret-key.ts';
import { buildContainer, TOKENS } from './container.ts';
import { startApi } from './daemons/api.ts';
import { startJobs } from './daemons/jobs.ts';
import { startLmtp } from './daemons/lmtp.ts';
import { startMilter } from './daemons/milter.ts';
import { startPolicy } from './daemons/policy.ts';
import { createLog } from './log.ts';
import { followMaillog } from './postfix/follow-maillog.ts';
import { PostfixInstance } from './postfix/instance.ts';
import type { Database } from './storage/database.ts';
import { migrate } from './storage/migrate.ts';

const ENTRIES = ['api', 'policy', 'milter', 'lmtp', 'jobs', 'migrate', 'all'] as const;
type Entry = (typeof ENTRIES)[number];

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
  const log = createLog(entry);
  const config = await ensureSecretKey(loadConfig());
  if (entry === 'migrate' || entry === 'all') {
    const applied = await migrate(config.databaseUrl);
    log({ msg: 'migrated', applied });
    if (entry === 'migrate') return;
  }
  const all = entry === 'all';
  const container = buildContainer(config, {
    log: createLog(all ? 'service' : entry),
    poolSize: all ? 20 : 10,
  });
  const running: Running[] = [];
  const stop = async (signal: string) => {
    log({ msg: 'stopping', signal });
    const timer = setTimeout(() => process.exit(1), 40_000);
    timer.unref();
    // Postfix first, so no new delivery starts; then each daemon finishes what it has in flight.
    for (const item of running.reverse()) {
      await item
        .close()
        .catch((error: unknown) =>
          log({ level: 'error', msg: 'stop failed', name: item.name, error: String(error) }),
        );
    }
    await container.resolve<Database>(TOKENS.Database).close();
    log({ msg: 'stopped' });
    process.exit(0);
  };
  process.once('SIGTERM', () => void stop('SIGTERM'));
  process.once('SIGINT', () => void stop('SIGINT'));

  if (entry === 'api' || all) {
    const server = await startApi(container);
    running.push({
      name: 'api',
      close: () =>
        new Promise((resolve) => {
          server.close(resolve);
          server.closeIdleConnections();
        }),
    });
    log({
      msg: 'listening',
      api: `http://${config.apiHost}:${config.apiPort}`,
      public_base_url: config.publicBaseUrl,
    });
  }
  if (entry === 'policy' || all) {
    const server = await startPolicy(container, createLog('policy'));
    running.push({ name: 'policy', close: () => server.close() });
    log({ msg: 'listening', policy: server.address });
  }
  if (entry === 'milter' || all) {
    const server = await startMilter(container, createLog('milter'));
    running.push({ name: 'milter', close: () => server.close() });
    log({ msg: 'listening', milter: server.address });
  }
  if (entry === 'lmtp' || all) {
    const server = await startLmtp(container, createLog('lmtp'));
    running.push({ name: 'lmtp', close: () => server.close() });
    log({ msg: 'listening', lmtp: server.address });
  }
  if (entry === 'jobs' || all) {
    const schedule = startJobs(container, createLog('jobs'));
    running.push({ name: 'jobs', close: () => schedule.close() });
    log({ msg: 'scheduled', jobs: `every ${config.sweepIntervalSeconds} s` });
  }
  if (all) {
    const postfix = PostfixInstance.forService(config);
    await postfix.stop(); // a master left running by a previous run that was killed
    await postfix.prepare();
    const following = followMaillog(postfix.dirs.maillogFile, createLog('postfix'));
    await postfix.start();
    running.push({
      name: 'postfix',
      close: async () => {
        await postfix.stop();
        following.stop();
      },
    });
    log({
      msg: 'listening',
      smtp: `${postfix.smtp.host}:${postfix.smtp.port}`,
      mail_domain: config.mailDomain,
    });
  }
}

main(process.argv.slice(2)).catch((error: unknown) => {
  if (error instanceof ConfigError) {
    process.stderr.write(`configuration error: ${error.message}\n`);
    process.exit(78);
  }
  process.stderr.write(`fatal: ${error instanceof Error ? error.stack : String(error)}\n`);
  process.exit(1);
});
