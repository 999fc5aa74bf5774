/**
 * maintenance-target - what ensure-database needs from DATABASE_URL: the database it names, and where
 * to connect to create it (the same server and credentials, database `postgres`). Read with
 * node-postgres's own parser, so every form the service itself accepts works here too (URLs,
 * `socket:/dir?db=name`, `postgres://user@/name?host=/dir`, `/dir name`).
 */
import type { ClientConfig } from 'pg';
import { parseIntoClientConfig } from 'pg-connection-string';

export interface MaintenanceTarget {
  /** The database DATABASE_URL names; undefined when it names none. */
  name: string | undefined;
  /** The connection to create it over. */
  maintenance: ClientConfig;
}

export function maintenanceTarget(databaseUrl: string): MaintenanceTarget {
  const target = parseIntoClientConfig(databaseUrl);
  return { name: target.database || undefined, maintenance: { ...target, database: 'postgres' } };
}
