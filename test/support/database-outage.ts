/**
 * database-outage - one database made unreachable and reachable again from an admin connection, for
 * tests and the crash soak: it refuses new connections (ALLOW_CONNECTIONS false) and the sessions it had
 * are ended by the server, as in a failover or a restart; the rest of the cluster is untouched.
 */
import pg from 'pg';

const SESSIONS = 'FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()';

/** The server process ids of the database's sessions (this admin connection's own excluded). */
export async function sessionPids(client: pg.Client, database: string): Promise<number[]> {
  const { rows } = await client.query<{ pid: number }>(`SELECT pid ${SESSIONS}`, [database]);
  return rows.map((row) => row.pid);
}

/** Ends every session of the database: its clients see their connections terminated. */
export async function endSessions(client: pg.Client, database: string): Promise<void> {
  await client.query(`SELECT pg_terminate_backend(pid) ${SESSIONS}`, [database]);
}

export async function allowConnections(client: pg.Client, database: string, allow: boolean): Promise<void> {
  await client.query(`ALTER DATABASE ${pg.escapeIdentifier(database)} WITH ALLOW_CONNECTIONS ${allow}`);
}
