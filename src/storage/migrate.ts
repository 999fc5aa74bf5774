/**
 * migrate - applies the knex migrations in `migrations/` (append-only, timestamped; STYLE 15).
 *
 * The files are TypeScript modules exporting `up` and `down`; they are loaded with import(), which
 * Node 24 runs natively, so no build step stands between a checkout and a migrated database.
 */
import { readdir } from 'node:fs/promises';
import knexFactory, { type Knex } from 'knex';

const MIGRATIONS = new URL('../../migrations/', import.meta.url);

interface MigrationModule {
  up(knex: Knex): Promise<void>;
  down(knex: Knex): Promise<void>;
}

const source: Knex.MigrationSource<string> = {
  async getMigrations() {
    return (await readdir(MIGRATIONS)).filter((name) => /^\d{14}_[a-z0-9_]+\.ts$/.test(name)).sort();
  },
  getMigrationName: (name) => name,
  getMigration: async (name) => (await import(new URL(name, MIGRATIONS).href)) as MigrationModule,
};

export function createKnex(connectionString: string): Knex {
  return knexFactory({
    client: 'pg',
    connection: connectionString,
    pool: { min: 0, max: 2 },
    // knex writes "Acquire connection error" with a stack (on stdout) before it throws the same error,
    // which the caller reports in one line (inboxctl, main.ts's migrate step); other warnings go through.
    log: {
      warn(message: string) {
        if (!String(message).startsWith('Acquire connection error')) console.warn(message);
      },
    },
  });
}

/** Applies every pending migration; returns the names applied. */
export async function migrate(connectionString: string): Promise<string[]> {
  const knex = createKnex(connectionString);
  try {
    const [, applied] = (await knex.migrate.latest({ migrationSource: source })) as [number, string[]];
    return applied;
  } finally {
    await knex.destroy();
  }
}
