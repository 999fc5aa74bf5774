/**
 * database - the Postgres connection pool every store shares.
 *
 * Queries are named prepared statements over node-postgres (the hot paths run a handful of fixed
 * statements; knex is used for migrations and the operator CLI, where building SQL pays off).
 * int8 values are parsed to numbers: sizes and positions stay far below 2^53.
 */
import pg from 'pg';

const types = {
  getTypeParser(oid: number, format?: 'text' | 'binary') {
    if (oid === 20 && format !== 'binary') return (value: string) => Number(value);
    return pg.types.getTypeParser(oid, format);
  },
};

export type Queryable = pg.Pool | pg.PoolClient;

export class Database {
  readonly pool: pg.Pool;

  constructor(connectionString: string, max = 20) {
    this.pool = new pg.Pool({ connectionString, max, types: types as pg.CustomTypesConfig });
    // An idle client losing its connection must not crash the process; the pool replaces it.
    this.pool.on('error', () => {});
  }

  async rows<T>(name: string, text: string, values: unknown[], on: Queryable = this.pool): Promise<T[]> {
    const result = await on.query({ name, text, values });
    return result.rows as T[];
  }

  /** Runs fn in a transaction on one client; rolls back on any error and rethrows it. */
  async transaction<T>(fn: (client: pg.PoolClient) => Promise<T>): Promise<T> {
    const client = await this.pool.connect();
    try {
      await client.query('BEGIN');
      const result = await fn(client);
      await client.query('COMMIT');
      return result;
    } catch (error) {
      await client.query('ROLLBACK').catch(() => {});
      throw error;
    } finally {
      client.release();
    }
  }

  async close(): Promise<void> {
    await this.pool.end();
  }
}
