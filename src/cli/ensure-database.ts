/**
 * ensure-database - creates the database named in DATABASE_URL when it does not exist yet
 * (`make run` and `make test` call it; production creates its database by other means).
 */
import pg from 'pg';
import { ConfigError, loadConfig } from '../config/config.ts';

async function main(): Promise<void> {
  const configured = loadConfig().databaseUrl;
  const url = URL.canParse(configured) ? new URL(configured) : undefined;
  if (!url?.pathname.slice(1)) {
    process.stderr.write('ensure-database: DATABASE_URL names no database in a URL path; not creating one\n');
    return;
  }
  const name = decodeURIComponent(url.pathname.slice(1));
  const maintenance = new URL(url);
  maintenance.pathname = '/postgres';
  const client = new pg.Client({ connectionString: maintenance.toString() });
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
