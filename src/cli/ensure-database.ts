/**
 * ensure-database - creates the database named in DATABASE_URL when it does not exist yet
 * (`make run`, `make migrate` and `make bench-api` call it; production creates its database by other means).
 */
import pg from 'pg';
import { ConfigError, loadConfig } from '../config/config.ts';
import { maintenanceTarget } from './maintenance-target.ts';

async function main(): Promise<void> {
  const { name, maintenance } = maintenanceTarget(loadConfig().databaseUrl);
  if (!name) {
    process.stderr.write('ensure-database: DATABASE_URL names no database; not creating one\n');
    return;
  }
  const client = new pg.Client(maintenance);
  await client.connect();
  try {
    const exists = await client.query('SELECT 1 FROM pg_database WHERE datname = $1', [name]);
    if (exists.rowCount === 0) {
      await client.query(`CREATE DATABASE "${name.replaceAll('"', '""')}"`);
      process.stdout.write(`created database ${name}\n`);
    }
  } finally {
    await client.end();
  }
}

main().catch((error: unknown) => {
  const message = error instanceof ConfigError ? `configuration error: ${error.message}` : String(error);
  process.stderr.write(`ensure-database: ${message}\n`);
  // 78 (EX_CONFIG) for a bad variable, as every other entry point.
  process.exit(error instanceof ConfigError ? 78 : 1);
});
