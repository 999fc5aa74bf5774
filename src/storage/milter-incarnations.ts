/**
 * milter-incarnations - each live milter process's heartbeat, and the release of what a dead one
 * reserved but may never have answered (migrations/20261207000000_reservation_owner.ts explains why).
 *
 * A heartbeat is PostgreSQL's clock, so milters on hosts whose clocks differ agree on who is dead;
 * `answered_before` and `reserved_at` are both the milter's own clock, compared only with each other.
 * The release deletes the rows (as a withdrawal does): a delivery of that queue id, had Postfix
 * queued it after all, is still stored.
 */
import type { Database } from './database.ts';

export interface OrphanRelease {
  /** Dead milters whose rows were looked at. */
  dead: number;
  /** Reservations deleted, and their bytes. */
  released: number;
  bytes: number;
}

/** Dead milters taken per sweep; the rest wait for the next one. */
const DEAD_PER_SWEEP = 16;

export class PgMilterIncarnations {
  readonly #db: Database;

  constructor(db: Database) {
    this.#db = db;
  }

  /** This milter is alive, and answered every reservation it made before `answeredBefore`. */
  async beat(incarnation: string, answeredBefore: Date): Promise<void> {
    await this.#db.rows(
      'milter-heartbeat',
      `INSERT INTO milter_incarnations (incarnation_id, heartbeat_at, answered_before) VALUES ($1, now(), $2)
       ON CONFLICT (incarnation_id) DO UPDATE
         SET heartbeat_at = now(), answered_before = excluded.answered_before`,
      [incarnation, answeredBefore],
    );
  }

  /** A milter that stopped with every reservation answered: nothing of it is left to sweep. */
  async forget(incarnation: string): Promise<void> {
    await this.#db.rows('milter-forget', 'DELETE FROM milter_incarnations WHERE incarnation_id = $1', [
      incarnation,
    ]);
  }

  /**
   * Deletes the in-flight reservations of every milter silent for `leaseSeconds`, from `marginSeconds`
   * before its last `answered_before` on, then that milter's row once none of them is left. A row a
   * delivery holds is skipped (the delivery is storing it: it was no ghost) and so is its milter's row,
   * until a later sweep.
   */
  async releaseOrphans(leaseSeconds: number, marginSeconds: number): Promise<OrphanRelease> {
    return this.#db.transaction(async (client) => {
      const [row] = await this.#db.rows<OrphanRelease & { ids: string[] }>(
        'milter-orphans-release',
        `WITH dead AS MATERIALIZED (
           SELECT incarnation_id, answered_before - make_interval(secs => $2) AS since
           FROM milter_incarnations WHERE heartbeat_at < now() - make_interval(secs => $1)
           ORDER BY heartbeat_at LIMIT $3 FOR UPDATE SKIP LOCKED),
         ghosts AS MATERIALIZED (
           SELECT m.inbox_id, m.message_id FROM messages m JOIN dead d ON m.reserved_by = d.incarnation_id
           WHERE m.state = 'in_flight' AND m.reserved_at >= d.since
           FOR UPDATE OF m SKIP LOCKED),
         released AS (
           DELETE FROM messages m USING ghosts g
           WHERE m.inbox_id = g.inbox_id AND m.message_id = g.message_id
           RETURNING m.size_bytes)
         SELECT (SELECT count(*) FROM dead)::int AS dead,
           (SELECT count(*) FROM released)::int AS released,
           (SELECT coalesce(sum(size_bytes), 0) FROM released)::int8 AS bytes,
           (SELECT coalesce(array_agg(incarnation_id::text), '{}') FROM dead) AS ids`,
        [leaseSeconds, marginSeconds, DEAD_PER_SWEEP],
        client,
      );
      if (!row) throw new Error('the orphan release returned no row');
      if (row.ids.length > 0) {
        // A later statement of this transaction: it sees the deletes above.
        await this.#db.rows(
          'milter-incarnations-forget',
          `DELETE FROM milter_incarnations i WHERE i.incarnation_id = ANY($1::uuid[])
             AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.reserved_by = i.incarnation_id
               AND m.state = 'in_flight' AND m.reserved_at >= i.answered_before - make_interval(secs => $2))`,
          [row.ids, marginSeconds],
          client,
        );
      }
      return { dead: row.dead, released: row.released, bytes: Number(row.bytes) };
    });
  }
}
