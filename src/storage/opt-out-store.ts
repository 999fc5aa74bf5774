/**
 * opt-out-store - the registry of sender domains whose owners asked us to refuse their mail.
 */
import type { OptOutStore } from '../core/ports.ts';
import type { Database } from './database.ts';

export class PgOptOutStore implements OptOutStore {
  readonly #db: Database;

  constructor(db: Database) {
    this.#db = db;
  }

  async findOptedOut(domains: string[]): Promise<string[]> {
    if (domains.length === 0) return [];
    const rows = await this.#db.rows<{ domain: string }>(
      'optouts-find',
      'SELECT domain FROM sender_optouts WHERE domain = ANY($1)',
      [domains],
    );
    return rows.map((row) => row.domain);
  }

  async add(domain: string, now: Date): Promise<boolean> {
    const rows = await this.#db.rows(
      'optouts-add',
      'INSERT INTO sender_optouts (domain, created_at) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING 1',
      [domain, now],
    );
    return rows.length > 0;
  }

  async remove(domain: string): Promise<boolean> {
    const rows = await this.#db.rows(
      'optouts-remove',
      'DELETE FROM sender_optouts WHERE domain = $1 RETURNING 1',
      [domain],
    );
    return rows.length > 0;
  }

  async list(): Promise<{ domain: string; createdAt: Date }[]> {
    const rows = await this.#db.rows<{ domain: string; created_at: Date }>(
      'optouts-list',
      'SELECT domain, created_at FROM sender_optouts ORDER BY domain',
      [],
    );
    return rows.map((row) => ({ domain: row.domain, createdAt: row.created_at }));
  }
}
