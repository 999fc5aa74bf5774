/**
 * database - one migrated template database per test run, and a fresh clone of it per test file
 * (STYLE 18). Cloning a template is a file copy inside Postgres: far faster than migrating again.
 */
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { migrate } from '../../src/storage/migrate.ts';

export const ADMIN_URL = process.env.TEST_DATABASE_ADMIN_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
/** Set by global-setup for the whole run, so concurrent runs never share (or drop) one template. */
const template = (): string => {
  const name = process.env.INBOX_TEST_TEMPLATE;
  if (!name)
    throw new Error(
      'INBOX_TEST_TEMPLATE is unset: run the tests with --test-global-setup=test/support/global-setup.ts',
    );
  return name;
};

export function databaseUrl(name: string, adminUrl = ADMIN_URL): string {
  const url = new URL(adminUrl);
  url.pathname = `/${name}`;
  return url.toString();
}

/** Runs `fn` on a fresh connection to `url` (the admin database by default), closed afterwards. */
export async function asAdmin<T>(fn: (client: pg.Client) => Promise<T>, url = ADMIN_URL): Promise<T> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

/**
 * Drops `name` if it exists, creates it anew on the server of `adminUrl` and migrates it; returns its
 * URL. This run's template (once, before the test files) and each benchmark's scratch database.
 */
export async function recreateDatabase(name: string, adminUrl = ADMIN_URL): Promise<string> {
  await asAdmin(async (client) => {
    await client.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    await client.query(`CREATE DATABASE ${name}`);
  }, adminUrl);
  const url = databaseUrl(name, adminUrl);
  await migrate(url);
  return url;
}

export async function dropDatabase(name: string): Promise<void> {
  await asAdmin((client) => client.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`));
}

export interface TestDatabase {
  name: string;
  url: string;
  drop(): Promise<void>;
}

/** A new database cloned from the migrated template. */
export async function freshDatabase(): Promise<TestDatabase> {
  const name = `inbox_test_${randomBytes(6).toString('hex')}`;
  await asAdmin((client) => client.query(`CREATE DATABASE ${name} TEMPLATE ${template()}`));
  return {
    name,
    url: databaseUrl(name),
    drop: () =>
      asAdmin((client) => client.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)).then(() => undefined),
  };
}
