/**
 * database - the Postgres connection pool every store shares.
 *
 * Queries are named prepared statements over node-postgres (the hot paths run a handful of fixed
 * statements; knex is used for migrations and the operator CLI, where building SQL pays off).
 * int8 values are parsed to numbers: sizes and positions stay far below 2^53.
 */
import pg from 'pg';

/**
 * timestamptz as Postgres prints it in a UTC session: `2026-11-21 10:41:59.928+00` (fraction optional).
 * Parsed by position, not by the general regex, since every poll reads a hundred of them; anything else
 * (infinity, BC, another offset) goes to node-postgres's own parser.
 */
const UTC_TIMESTAMP = /^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d{1,6})?\+00$/;
const defaultTimestamptz = pg.types.getTypeParser(1184, 'text') as (value: string) => Date;

export function parseTimestamptz(value: string): Date {
  if (!UTC_TIMESTAMP.test(value)) return defaultTimestamptz(value);
  const ms = value.length > 22 ? Math.floor(Number(`0${value.slice(19, -3)}`) * 1000) : 0;
  return new Date(
    Date.UTC(
      Number(value.slice(0, 4)),
      Number(value.slice(5, 7)) - 1,
      Number(value.slice(8, 10)),
      Number(value.slice(11, 13)),
      Number(value.slice(14, 16)),
      Number(value.slice(17, 19)),
      ms,
    ),
  );
}

const types = {
  getTypeParser(oid: number, format?: 'text' | 'binary') {
    if (oid === 20 && format !== 'binary') return (value: string) => Number(value);
    if (oid === 1184 && format !== 'binary') return parseTimestamptz;
    return pg.types.getTypeParser(oid, format);
  },
};

export type Queryable = pg.Pool | pg.PoolClient;

export class Database {
  readonly pool: pg.Pool;

  constructor(connectionString: string, max = 20) {
    this.pool = new pg.Pool({
      connectionString,
      max,
      types: types as pg.CustomTypesConfig,
      // Every hot statement is a named prepared statement over indexed equality lookups: a generic plan
      // is as good as a custom one, and re-planning the larger ones (the gatekeeper's CTE, the event
      // listing) on every execution cost more CPU than running them.
      // UTC sessions print timestamptz in the one form parseTimestamptz reads by position.
      options: '-c plan_cache_mode=force_generic_plan -c TimeZone=UTC',
    });
    // An idle client losing its connection must not crash the process; the pool replaces it.
    this.pool.on('error', () => {});
  }

  async rows<T>(name: string, text: string, values: unknown[], on: Queryable = this.pool): Promise<T[]> {
    // Dates go as ISO strings: node-postgres's own Date formatting is several times slower.
    const params = values.map((value) => (value instanceof Date ? value.toISOString() : value));
    const result = await on.query({ name, text, values: params });
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
