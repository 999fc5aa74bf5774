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

/**
 * How long a statement waits for a lock, and a caller for a connection, before failing. A transaction
 * stuck holding a lock (or a migration, or a full pool) then fails requests after this long, which the
 * mail daemons answer as a temporary failure (a 4xx, or a policy disconnect), instead of holding
 * Postfix's processes for as long as the stall lasts. Every hot path holds its locks for milliseconds.
 */
export const LOCK_TIMEOUT_MS = 20_000;
export const CONNECT_TIMEOUT_MS = 20_000;

/**
 * How long a pooled connection lives (s); ended when next released after that. Each connection keeps
 * the generic plans it made (plan_cache_mode below, PL/pgSQL's too) until an ANALYZE invalidates them,
 * and plans made on a new, nearly empty table can read a whole inbox once it has filled: with
 * autovacuum off, for as long as the process runs (a review found seven such statements besides the
 * mail path's, whose indexes migrations 20261209000000 to 20261211000000 give keys of their own; after
 * an ANALYZE of a nearly empty table every statement plans a sequential scan, which only a new plan
 * ends). A new connection plans from the table as it is now. A reconnect costs its first statements
 * about 15 ms, once per connection per lifetime.
 */
export const CONNECTION_LIFETIME_SECONDS = 300;

const UNUSABLE = Symbol('unusable connection');

/**
 * Whether an error says the database cannot be reached or went away (not that a statement failed):
 * refused or lost connections, a connect timeout, a server shutting down. The API logs these without
 * a stack, a few per outage (http/error-middleware.ts).
 */
export function isDatabaseUnavailable(error: unknown): boolean {
  if (!(error instanceof Error)) return false;
  const code = (error as { code?: string }).code ?? '';
  return (
    isConnectionError(error) ||
    ['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'ETIMEDOUT', 'EHOSTUNREACH', 'ENETUNREACH'].includes(code) ||
    // Not pg-pool's "timeout exceeded when trying to connect": that is a pool whose clients are all
    // busy (slow statements, lock waits), with PostgreSQL answering; it keeps its stack.
    /the database system is (starting up|shutting down)/.test(error.message)
  );
}

/** Errors after which a connection cannot be trusted: it ended, or the server is going away (57P0x). */
function isConnectionError(error: Error): boolean {
  const code = (error as { code?: string }).code ?? '';
  return (
    code.startsWith('57P') ||
    code.startsWith('08') ||
    /Connection terminated|ECONNRESET|EPIPE/.test(error.message)
  );
}

export class Database {
  readonly pool: pg.Pool;
  readonly #connectionString: string;

  constructor(
    connectionString: string,
    max = 20,
    limits: { lockTimeoutMs?: number; connectTimeoutMs?: number; lifetimeSeconds?: number } = {},
  ) {
    this.#connectionString = connectionString;
    this.pool = new pg.Pool({
      connectionString,
      max,
      connectionTimeoutMillis: limits.connectTimeoutMs ?? CONNECT_TIMEOUT_MS,
      maxLifetimeSeconds: limits.lifetimeSeconds ?? CONNECTION_LIFETIME_SECONDS,
      types: types as pg.CustomTypesConfig,
      // Every hot statement is a named prepared statement over indexed equality lookups: a generic plan
      // is as good as a custom one, and re-planning the larger ones (the gatekeeper's CTE, the event
      // listing) on every execution cost more CPU than running them.
      // UTC sessions print timestamptz in the one form parseTimestamptz reads by position.
      options: `-c plan_cache_mode=force_generic_plan -c TimeZone=UTC -c lock_timeout=${limits.lockTimeoutMs ?? LOCK_TIMEOUT_MS}`,
      // A server gone without a reset (a crashed host, a failover, an idle-dropping firewall) would
      // leave a connection waiting for a reply forever; keepalive probes end it, and the query fails.
      keepAlive: true,
      keepAliveInitialDelayMillis: 30_000,
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

  /** PostgreSQL's clock (clock_timestamp()), in milliseconds since the epoch. */
  async clockMs(): Promise<number> {
    const result = await this.pool.query<{ ms: number }>(
      'SELECT extract(epoch FROM clock_timestamp())::float8 * 1000 AS ms',
    );
    return Number(result.rows[0]?.ms);
  }

  /** Runs fn in a transaction on one client; rolls back on any error and rethrows it. */
  async transaction<T>(fn: (client: pg.PoolClient) => Promise<T>): Promise<T> {
    return this.withClient(async (client) => {
      await client.query('BEGIN');
      try {
        const result = await fn(client);
        await client.query('COMMIT');
        return result;
      } catch (error) {
        // A client that cannot roll back is in an unknown state: withClient destroys it.
        await client.query('ROLLBACK').catch((rollback: Error) => {
          throw Object.assign(error instanceof Error ? error : new Error(String(error)), {
            [UNUSABLE]: rollback,
          });
        });
        throw error;
      }
    });
  }

  /**
   * Runs fn on one checked-out client. While checked out, a client whose connection the server ends
   * (a restart, pg_terminate_backend) emits 'error' with no pool listener attached: unhandled, that
   * would end the process. It is caught here, and such a client is destroyed, not reused.
   */
  async withClient<T>(fn: (client: pg.PoolClient) => Promise<T>): Promise<T> {
    const client = await this.pool.connect();
    let broken: Error | undefined;
    const onError = (error: Error) => {
      broken = error;
    };
    client.on('error', onError);
    try {
      return await fn(client);
    } catch (error) {
      if (error instanceof Error && (UNUSABLE in error || isConnectionError(error))) broken ??= error;
      throw error;
    } finally {
      client.off('error', onError);
      client.release(broken);
    }
  }

  /**
   * `SELECT 1` (readiness); rejects when the server cannot be reached. On a pooled connection, unless
   * every one is busy (slow statements, long deliveries): waiting for one would read as "unreachable"
   * while PostgreSQL answers, and a load balancer would drop every busy replica at once (ops review).
   * Then on a connection of its own, closed after.
   */
  async ping(): Promise<void> {
    const { idleCount, totalCount, options } = this.pool;
    if (idleCount > 0 || totalCount < (options.max ?? 10)) {
      await this.pool.query('SELECT 1');
      return;
    }
    // Bounded, so probes every few seconds against a server that does not answer do not pile up.
    const client = new pg.Client({ connectionString: this.#connectionString, connectionTimeoutMillis: 2000 });
    client.on('error', () => {});
    try {
      await client.connect();
      await client.query('SELECT 1');
    } finally {
      await client.end().catch(() => undefined);
    }
  }

  /** The pool's connections and the queries waiting for one (metrics). */
  poolUse(): { total: number; idle: number; waiting: number; max: number } {
    const { totalCount, idleCount, waitingCount, options } = this.pool;
    return { total: totalCount, idle: idleCount, waiting: waitingCount, max: options.max ?? 10 };
  }

  async close(): Promise<void> {
    await this.pool.end();
  }
}
