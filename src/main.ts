/**
 * main - the one binary: `node src/main.ts api | migrate | all`.
 *
 * `all` migrates and runs every daemon in one process (the small install `make run` uses).
 * Configuration comes from the environment only; a bad value stops the process naming the variable.
 */
import type { Server } from 'node:http';
import { ConfigError, loadConfig } from './config/config.ts';
import { ensureSecretKey } from './config/secret-key.ts';
import { buildContainer, TOKENS } from './container.ts';
import { startApi } from './daemons/api.ts';
import { createLog } from './log.ts';
import type { Database } from './storage/database.ts';
import { migrate } from './storage/migrate.ts';

const ENTRIES = ['api', 'migrate', 'all'] as const;

async function main(argv: string[]): Promise<void> {
  const entry = argv[0] ?? 'all';
  if (!(ENTRIES as readonly string[]).includes(entry)) {
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
  const container = buildContainer(config, { log: createLog('api') });
  const servers: Server[] = [await startApi(container)];
  log({
    msg: 'listening',
    api: `http://${config.apiHost}:${config.apiPort}`,
    public_base_url: config.publicBaseUrl,
  });

  const stop = (signal: string) => {
    log({ msg: 'stopping', signal });
    for (const server of servers) {
      server.close();
      server.closeIdleConnections();
    }
    const timer = setTimeout(() => process.exit(1), 10_000);
    timer.unref();
    Promise.all(servers.map((s) => new Promise((resolve) => s.once('close', resolve))))
      .then(() => container.resolve<Database>(TOKENS.Database).close())
      .then(() => process.exit(0));
  };
  process.once('SIGTERM', () => stop('SIGTERM'));
  process.once('SIGINT', () => stop('SIGINT'));
}

main(process.argv.slice(2)).catch((error: unknown) => {
  if (error instanceof ConfigError) {
    process.stderr.write(`configuration error: ${error.message}\n`);
    process.exit(78);
  }
  process.stderr.write(`fatal: ${error instanceof Error ? error.stack : String(error)}\n`);
  process.exit(1);
});
