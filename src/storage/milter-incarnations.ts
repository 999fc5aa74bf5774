/**
 * milter-incarnations - each live milter process's heartbeat, and the release of what a dead one
 * reserved but may never have answered (migrations/20261207000000_reservation_owner.ts explains why).
 *
 * A heartbeat is PostgreSQL's clock, so milters on hosts whose clocks differ agree on who is dead;
 * `answered_before` and `reserved_at` are both the milter's own clock, compared only with each other.
 * The release deletes the rows (as a withdrawal does): a delivery of that queue id, had Postfix
 * queued it after all, is still stored.
 */
import type { LedgerSnapshot } from '../core/reservation-ledger.ts';
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

/**
 * The in-flight rows of the milters in `dead` that may be unanswered: named as open in their last
 * heartbeat, or reserved at or after its `answered_before` (core/reservation-ledger.ts).
 */
const UNANSWERED = `
  SELECT d.incarnation_id, m.inbox_id, m.message_id FROM dead d JOIN messages m
    ON m.reserved_by = d.incarnation_id AND m.state = 'in_flight' AND m.reserved_at >= d.answered_before
  UNION
  SELECT d.incarnation_id, m.inbox_id, m.message_id FROM dead d
    CROSS JOIN LATERAL unnest(d.open_inbox_ids, d.open_message_ids) AS k (inbox_id, message_id)
    JOIN messages m ON m.inbox_id = k.inbox_id AND m.message_id = k.message_id
      AND m.reserved_by = d.incarnation_id AND m.state = 'in_flight'`;

/**
 * One statement: the dead milters (silent for $1 seconds; SKIP LOCKED, so two sweepers share them),
 * their possibly unanswered rows locked with SKIP LOCKED (a row a delivery holds is being stored: no
 * ghost), deleted if still in flight; then each dead milter's row, unless a row of it was skipped.
 * The keys go from step to step as arrays through unnest, whose small estimate keeps every step on
 * the primary key (joined as sets, a large in-flight backlog was read whole: a review measured a
 * sequential scan of 150,000 in-flight rows).
 */
const RELEASE_SQL = `
  WITH dead AS MATERIALIZED (
    SELECT incarnation_id, answered_before, open_inbox_ids, open_message_ids FROM milter_incarnations
    WHERE heartbeat_at < now() - make_interval(secs => $1)
    ORDER BY heartbeat_at LIMIT $2 FOR UPDATE SKIP LOCKED),
  unanswered AS MATERIALIZED (${UNANSWERED}),
  picked AS MATERIALIZED (
    SELECT array_agg(inbox_id) AS inbox_ids, array_agg(message_id) AS message_ids FROM unanswered),
  ghosts AS MATERIALIZED (
    SELECT m.inbox_id, m.message_id FROM messages m
      JOIN unnest((SELECT inbox_ids FROM picked), (SELECT message_ids FROM picked)) AS u (inbox_id, message_id)
        USING (inbox_id, message_id)
    WHERE m.state = 'in_flight'
    FOR UPDATE OF m SKIP LOCKED),
  locked AS MATERIALIZED (
    SELECT array_agg(inbox_id) AS inbox_ids, array_agg(message_id) AS message_ids FROM ghosts),
  released AS (
    DELETE FROM messages m
      USING unnest((SELECT inbox_ids FROM locked), (SELECT message_ids FROM locked)) AS g (inbox_id, message_id)
    WHERE m.inbox_id = g.inbox_id AND m.message_id = g.message_id AND m.state = 'in_flight'
    RETURNING m.size_bytes),
  forgotten AS (
    DELETE FROM milter_incarnations i USING dead d
    WHERE i.incarnation_id = d.incarnation_id
      AND NOT EXISTS (SELECT 1 FROM unanswered u WHERE u.incarnation_id = d.incarnation_id
        AND NOT EXISTS (SELECT 1 FROM ghosts g WHERE g.inbox_id = u.inbox_id AND g.message_id = u.message_id))
    RETURNING 1)
  SELECT (SELECT count(*) FROM dead)::int AS dead,
    (SELECT count(*) FROM released)::int AS released,
    (SELECT coalesce(sum(size_bytes), 0) FROM released)::int8 AS bytes`;

/**
 * How long the sweep waits for a lock (an inbox row whose held bytes it lowers) before it gives up
 * until its next run: it must not hold a connection, nor the inbox rows it already has, for the pool's
 * 20 s lock_timeout.
 */
const SWEEP_LOCK_TIMEOUT_MS = 1_000;

export class PgMilterIncarnations {
  readonly #db: Database;

  constructor(db: Database) {
    this.#db = db;
  }

  /** This milter is alive; what it has not answered is `snapshot` (core/reservation-ledger.ts). */
  async beat(incarnation: string, snapshot: LedgerSnapshot): Promise<void> {
    await this.#db.rows(
      'milter-heartbeat',
      `INSERT INTO milter_incarnations
         (incarnation_id, heartbeat_at, answered_before, open_inbox_ids, open_message_ids)
       VALUES ($1, now(), $2, $3, $4)
       ON CONFLICT (incarnation_id) DO UPDATE
         SET heartbeat_at = now(), answered_before = excluded.answered_before,
           open_inbox_ids = excluded.open_inbox_ids, open_message_ids = excluded.open_message_ids`,
      [
        incarnation,
        snapshot.answeredBefore,
        snapshot.open.map((k) => k.inboxId),
        snapshot.open.map((k) => k.messageId),
      ],
    );
  }

  /** A milter that stopped with every reservation answered: nothing of it is left to sweep. */
  async forget(incarnation: string): Promise<void> {
    await this.#db.rows('milter-forget', 'DELETE FROM milter_incarnations WHERE incarnation_id = $1', [
      incarnation,
    ]);
  }

  /** Releases what milters silent for `leaseSeconds` may have left unanswered (RELEASE_SQL). */
  async releaseOrphans(leaseSeconds: number): Promise<OrphanRelease> {
    const [row] = await this.#db.transaction(async (client) => {
      await client.query(`SET LOCAL lock_timeout = ${SWEEP_LOCK_TIMEOUT_MS}`);
      return this.#db.rows<OrphanRelease>(
        'milter-orphans-release',
        RELEASE_SQL,
        [leaseSeconds, DEAD_PER_SWEEP],
        client,
      );
    });
    if (!row) throw new Error('the orphan release returned no row');
    return { dead: row.dead, released: row.released, bytes: Number(row.bytes) };
  }
}
