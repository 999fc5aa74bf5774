/**
 * sweeper-store - Postgres implementation of the core's SweeperStore port: the statements the lifecycle
 * jobs run (src/jobs). Each method is one bounded batch in its own transaction.
 *
 * Rows a batch changes are picked with FOR UPDATE SKIP LOCKED: a delivery being stored, a download
 * being marked or another sweeper's batch is never waited for; what is skipped is taken by a later batch.
 * A DELETE's pick is a MATERIALIZED CTE, run once: a subquery may be rescanned by the plan, and its
 * LIMIT then bounds nothing.
 * Marking a message deleted and freeing its chunks happen in one transaction, the chunks after the mark:
 * a concurrent store either finished first (its chunks are then visible and freed) or finds the row
 * deleted and stores nothing (MessageStore.store answers 'duplicate', or 'expired' / 'released' for a
 * row that was never stored).
 */
import { createHash } from 'node:crypto';
import type pg from 'pg';
import type { BatchLimit, Freed, MessageKey, SweeperStore } from '../core/ports.ts';
import type { Database } from './database.ts';
import { UNDELETED_OF } from './rows.ts';

/** The first key of every job's advisory lock: 'inbx', so our locks never meet another application's. */
const LOCK_NAMESPACE = 0x696e6278;

/** The second key: 32 bits of SHA-256 of the job's name. */
export const lockKey = (job: string): number => createHash('sha256').update(job).digest().readInt32BE(0);

interface PickedRow {
  inbox_id: string;
  message_id: string;
  size_bytes: number;
}

/**
 * An inbox due for purge (lifecycle.isPurged): expired at or before the purge cutoff, or cancelled and
 * past its paid lifetime. `now` and `cutoff` name the statement's parameters.
 */
const purgeDue = (now: string, cutoff: string) =>
  `i.expires_at <= ${now} AND (i.expires_at <= ${cutoff} OR i.cancelled_at IS NOT NULL)`;

/**
 * The expiry sweep's pick: from the expired inboxes that still hold something (held_bytes counts every
 * message not yet deleted), each through its own key (messages_undeleted). Expired inboxes wait for
 * their purge with nothing but tombstones, and a join from messages walked the whole table to find
 * none; without the held_bytes filter every pick probed each of them (7-12 times slower with tens of
 * thousands waiting). The inbox rows are share-locked until the batch commits, and skipped while an
 * extend holds one: an extend that comes after waits for the batch, then finds its inbox expired.
 * A message of 0 bytes holds nothing and is never picked: the purge takes it (purgeInbox).
 */
export const EXPIRE_PICK_SQL = `SELECT m.inbox_id, m.message_id, m.size_bytes
  FROM inboxes i CROSS JOIN LATERAL (
    SELECT inbox_id, message_id, size_bytes FROM messages
    WHERE ${UNDELETED_OF('i.inbox_id')}
    LIMIT $2 FOR UPDATE SKIP LOCKED) m
  WHERE i.expires_at < $1 AND i.held_bytes > 0
  LIMIT $2 FOR SHARE OF i SKIP LOCKED`;

/**
 * How long what a job holds outlives a holder that stopped answering (a paused VM, a stopped process,
 * whose kernel still answers TCP keepalives): its lock, through the lock session's `idle_session_timeout`,
 * which the holder keeps from firing with a query every third of it while its run goes on; and the row
 * locks of the batch it was in, through the batch's `idle_in_transaction_session_timeout`.
 */
export const JOB_LOCK_LEASE_MS = 60_000;

/** delete-messages' pick of the messages whose delete_after has passed (indexes.test.ts plans it). */
export const DELETE_DUE_PICK_SQL = `SELECT inbox_id, message_id, size_bytes FROM messages
  WHERE state = 'stored' AND delete_after IS NOT NULL AND delete_after <= $1
  ORDER BY delete_after LIMIT $2 FOR UPDATE SKIP LOCKED`;

/**
 * drop-tombstones' pick ($1 deleted before, $2 reserved before, $3 now, $4 limit): rows past their 410
 * window and their reservation's horizon, in live inboxes, found through messages_tombstone_horizon.
 */
export const TOMBSTONE_PICK_SQL = `SELECT d.inbox_id, d.message_id FROM messages d JOIN inboxes i ON i.inbox_id = d.inbox_id
  WHERE d.state = 'deleted' AND d.deleted_at <= $1 AND d.reserved_at <= $2 AND i.expires_at > $3
    AND d.deleted_reason <> 'released'
  LIMIT $4 FOR UPDATE OF d SKIP LOCKED`;

export class PgSweeperStore implements SweeperStore {
  readonly #db: Database;
  readonly #leaseMs: number;

  constructor(db: Database, options: { lockLeaseMs?: number } = {}) {
    this.#db = db;
    this.#leaseMs = options.lockLeaseMs ?? JOB_LOCK_LEASE_MS;
  }

  /**
   * One batch: a transaction planned for its actual cutoffs. The pool plans every statement generically
   * (storage/database.ts), which for a range such as `delete_after <= $1` guesses a third of the table
   * and scans it all; a sweep runs rarely, so planning each statement with its values costs nothing.
   *
   * The transaction is a lease too: left idle for #leaseMs, PostgreSQL ends its session, and the row
   * locks go with it (inbox rows that deliveries update, messages they store into), which a process that
   * froze within a batch would otherwise keep for as long as it is frozen, every delivery needing one of
   * them failing with a 4xx after lock_timeout meanwhile. The job lock's length: a holder frozen for
   * less keeps both and carries on; one frozen for longer loses both, and on waking its batch fails
   * (rolled back by the server, the connection destroyed), its run fails and logs it, and the next run
   * does the work. A batch only runs its statements back to back, with no other wait between them (and
   * must stay so), so a live one is never idle for more than milliseconds.
   */
  async #batch<T>(fn: (client: pg.PoolClient) => Promise<T>): Promise<T> {
    return this.#db.transaction(async (client) => {
      await client.query(
        `SET LOCAL plan_cache_mode = force_custom_plan;
         SET LOCAL idle_in_transaction_session_timeout = ${Math.ceil(this.#leaseMs)}`,
      );
      return fn(client);
    });
  }

  /**
   * A session lock on a connection of its own, held while fn runs its batches on other connections.
   * The session is a lease: it ends, and the lock with it, when it stays idle for #leaseMs, so a holder
   * that froze (a paused VM, a stopped process, whose kernel still answers TCP keepalives) no longer
   * keeps every other process from running the job for as long as it is frozen. While fn runs, a query
   * every third of the lease keeps the session busy.
   */
  async exclusively<T>(
    job: string,
    fn: (lost: AbortSignal) => Promise<T>,
  ): Promise<{ ran: true; value: T } | { ran: false }> {
    const client = await this.#db.pool.connect();
    let broken: Error | undefined;
    const lost = new AbortController();
    const fail = (error: Error) => {
      broken ??= error;
      lost.abort(error);
    };
    client.on('error', fail);
    const key = [LOCK_NAMESPACE, lockKey(job)];
    let renewal: NodeJS.Timeout | undefined;
    try {
      const locked = await client
        .query(`SET idle_session_timeout = ${Math.ceil(this.#leaseMs)}`)
        .then(() => client.query<{ locked: boolean }>('SELECT pg_try_advisory_lock($1, $2) AS locked', key))
        .catch((error: Error) => {
          fail(error);
          throw error;
        });
      if (!locked.rows[0]?.locked) return { ran: false };
      renewal = setInterval(() => void client.query('SELECT 1').catch(fail), this.#leaseMs / 3);
      try {
        return { ran: true, value: await fn(lost.signal) };
      } finally {
        clearInterval(renewal);
        // A connection that cannot say it unlocked is destroyed: ending the session drops the lock.
        await client.query('SELECT pg_advisory_unlock($1, $2)', key).catch(fail);
      }
    } finally {
      clearInterval(renewal);
      // Back in the pool, the connection must not be ended for idling.
      if (!broken) await client.query('RESET idle_session_timeout').catch(fail);
      client.off('error', fail);
      client.release(broken);
    }
  }

  databaseClockMs(): Promise<number> {
    return this.#db.clockMs();
  }

  async expireMessages(now: Date, expiredBefore: Date, limit: BatchLimit): Promise<Freed> {
    return this.#markAndFree(
      EXPIRE_PICK_SQL,
      [expiredBefore, limit.rows],
      limit.bytes,
      // deleted_at after expires_at: the final counts, taken at expires_at (storage/usage.ts), keep them.
      // No extend can move expires_at meanwhile: the pick share-locked the inbox rows.
      `UPDATE messages m SET state = 'deleted',
         deleted_reason = CASE WHEN m.delete_after <= i.expires_at
           THEN CASE WHEN m.downloaded_at IS NULL THEN 'unclaimed' ELSE 'downloaded' END ELSE 'expired' END,
         deleted_at = CASE WHEN m.delete_after <= i.expires_at THEN m.delete_after ELSE $3::timestamptz END
       FROM inboxes i, unnest($1::text[], $2::text[]) AS k (inbox_id, message_id)
       WHERE m.inbox_id = k.inbox_id AND m.message_id = k.message_id AND i.inbox_id = m.inbox_id
       RETURNING m.inbox_id, m.message_id, m.size_bytes, m.deleted_reason`,
      [now],
    ).then(({ messages, bytes }) => ({ messages, bytes }));
  }

  async deleteDueMessages(
    now: Date,
    limit: BatchLimit,
  ): Promise<Freed & { downloaded: number; unclaimed: number }> {
    // deleted_at = delete_after: the usage rule already stopped counting the message then.
    return this.#markAndFree(
      DELETE_DUE_PICK_SQL,
      [now, limit.rows],
      limit.bytes,
      `UPDATE messages m SET state = 'deleted', deleted_at = m.delete_after,
         deleted_reason = CASE WHEN m.downloaded_at IS NULL THEN 'unclaimed' ELSE 'downloaded' END
       FROM unnest($1::text[], $2::text[]) AS k (inbox_id, message_id)
       WHERE m.inbox_id = k.inbox_id AND m.message_id = k.message_id
       RETURNING m.inbox_id, m.message_id, m.size_bytes, m.deleted_reason`,
      [],
    );
  }

  /**
   * Locks up to `limit` rows with `pick`, keeps a prefix holding at most `maxBytes` (at least one row),
   * marks them with `mark` ($1, $2: the keys, then `markValues`) and frees their chunks, in one
   * transaction.
   */
  async #markAndFree(
    pick: string,
    values: unknown[],
    maxBytes: number,
    mark: string,
    markValues: unknown[],
  ): Promise<Freed & { downloaded: number; unclaimed: number }> {
    return this.#batch(async (client) => {
      const picked = await query<PickedRow>(client, pick, values);
      const keys = withinBytes(picked, maxBytes);
      const freed = { messages: 0, bytes: 0, downloaded: 0, unclaimed: 0 };
      if (keys.length === 0) return freed;
      const marked = await query<PickedRow & { deleted_reason: string }>(client, mark, [
        keys.map((k) => k.inbox_id),
        keys.map((k) => k.message_id),
        ...markValues,
      ]);
      // The chunks of the rows marked.
      await query(
        client,
        `DELETE FROM message_chunks c USING unnest($1::text[], $2::text[]) AS k (inbox_id, message_id)
         WHERE c.inbox_id = k.inbox_id AND c.message_id = k.message_id`,
        [marked.map((m) => m.inbox_id), marked.map((m) => m.message_id)],
      );
      for (const row of marked) {
        freed.messages++;
        freed.bytes += row.size_bytes;
        if (row.deleted_reason === 'downloaded') freed.downloaded++;
        if (row.deleted_reason === 'unclaimed') freed.unclaimed++;
      }
      return freed;
    });
  }

  async storedCopies(
    after: MessageKey | null,
    limit: number,
  ): Promise<(MessageKey & { sizeBytes: number; storedBytes: number })[]> {
    // octet_length of a chunk reads its raw size from the value's header (TOAST pointer or lz4 header), not
    // its bytes.
    const rows = await this.#batch((client) =>
      query<PickedRow & { stored_bytes: number }>(
        client,
        `SELECT m.inbox_id, m.message_id, m.size_bytes,
         (SELECT coalesce(sum(octet_length(c.data)), 0)::int8 FROM message_chunks c
          WHERE c.inbox_id = m.inbox_id AND c.message_id = m.message_id) AS stored_bytes
       FROM messages m
       WHERE (m.inbox_id, m.message_id) > ($1, $2) AND m.state = 'stored'
       ORDER BY m.inbox_id, m.message_id LIMIT $3`,
        [after?.inboxId ?? '', after?.messageId ?? '', limit],
      ),
    );
    return rows.map((row) => ({
      inboxId: row.inbox_id,
      messageId: row.message_id,
      sizeBytes: row.size_bytes,
      storedBytes: row.stored_bytes,
    }));
  }

  async recordLost(message: MessageKey, now: Date): Promise<boolean> {
    return this.#batch(async (client) => {
      // What a poll lists and the usage change: the inbox's version moves in the same statement.
      const marked = await query(
        client,
        `WITH changed AS (
           UPDATE messages SET state = 'deleted', deleted_at = $3, deleted_reason = 'lost'
           WHERE inbox_id = $1 AND message_id = $2 AND state = 'stored' RETURNING message_id),
         bumped AS (
           UPDATE inboxes SET version = version + 1 WHERE inbox_id = $1 AND EXISTS (SELECT 1 FROM changed))
         SELECT message_id FROM changed`,
        [message.inboxId, message.messageId, now],
      );
      if (marked.length === 0) return false;
      await query(client, 'DELETE FROM message_chunks WHERE inbox_id = $1 AND message_id = $2', [
        message.inboxId,
        message.messageId,
      ]);
      return true;
    });
  }

  async inboxesToPurge(now: Date, purgeCutoff: Date, limit: number): Promise<string[]> {
    const rows = await this.#batch((client) =>
      query<{ inbox_id: string }>(
        client,
        `SELECT i.inbox_id FROM inboxes i WHERE ${purgeDue('$1', '$2')} ORDER BY i.expires_at LIMIT $3`,
        [now, purgeCutoff, limit],
      ),
    );
    return rows.map((row) => row.inbox_id);
  }

  async purgeInbox(
    inboxId: string,
    now: Date,
    purgeCutoff: Date,
    limit: number,
  ): Promise<{ messages: number; purged: boolean; waiting: boolean }> {
    return this.#batch(async (client) => {
      // The inbox row first, never waited for: a delivery still writing into it (its message row's
      // foreign key share-locks the inbox row, and the held-bytes trigger updates it) would otherwise hold
      // this batch for lock_timeout and fail the whole run, the other due inboxes with it. It waits.
      const [held] = await query(
        client,
        `SELECT 1 FROM inboxes i WHERE i.inbox_id = $1 AND ${purgeDue('$2', '$3')} FOR UPDATE SKIP LOCKED`,
        [inboxId, now, purgeCutoff],
      );
      if (!held) {
        const [due] = await query(
          client,
          `SELECT 1 FROM inboxes i WHERE i.inbox_id = $1 AND ${purgeDue('$2', '$3')}`,
          [inboxId, now, purgeCutoff],
        );
        return { messages: 0, purged: false, waiting: due !== undefined };
      }
      const deleted = await query(
        client,
        // With the tombstones go messages of 0 bytes not yet deleted (an empty LMTP DATA, a delivery
        // left in flight after expiry without a reservation): they hold nothing, so the expiry sweep
        // never picks them, and until 2026-11-25 their inbox waited for its purge for ever. A row a
        // delivery holds is skipped, and the inbox waits for a later run.
        // The pick is a CTE, run once: as a subquery the planner rescanned it for each row, and its LIMIT
        // then bounded nothing (7 rows went in a batch of 3).
        `WITH k AS MATERIALIZED (
           SELECT message_id FROM messages
           WHERE inbox_id = $1 AND (state = 'deleted' OR size_bytes = 0) LIMIT $2 FOR UPDATE SKIP LOCKED)
         DELETE FROM messages m USING k
         WHERE m.inbox_id = $1 AND m.message_id = k.message_id RETURNING m.message_id`,
        [inboxId, limit],
      );
      if (deleted.length === limit) return { messages: deleted.length, purged: false, waiting: false };
      // Messages still holding chunks wait for expireMessages, which frees them in bounded batches.
      const [left] = await query<{ waiting: boolean }>(
        client,
        'SELECT EXISTS (SELECT 1 FROM messages WHERE inbox_id = $1) AS waiting',
        [inboxId],
      );
      if (left?.waiting) return { messages: deleted.length, purged: false, waiting: true };
      // Credentials, rejections and extend keys go by ON DELETE CASCADE; rate buckets have no key to it.
      const purged = await query(
        client,
        `DELETE FROM inboxes i WHERE i.inbox_id = $1 AND ${purgeDue('$2', '$3')} RETURNING inbox_id`,
        [inboxId, now, purgeCutoff],
      );
      if (purged.length > 0) await query(client, 'DELETE FROM rate_buckets WHERE inbox_id = $1', [inboxId]);
      return { messages: deleted.length, purged: purged.length > 0, waiting: false };
    });
  }

  async dropTombstones(deletedBefore: Date, reservedBefore: Date, now: Date, limit: number): Promise<number> {
    const rows = await this.#batch((client) =>
      query(
        client,
        `WITH k AS MATERIALIZED (${TOMBSTONE_PICK_SQL})
       DELETE FROM messages m USING k
       WHERE m.inbox_id = k.inbox_id AND m.message_id = k.message_id RETURNING 1`,
        [deletedBefore, reservedBefore, now, limit],
      ),
    );
    return rows.length;
  }

  async dropRejections(listedBefore: Date, limit: number): Promise<number> {
    const rows = await this.#batch((client) =>
      query(
        client,
        `WITH k AS MATERIALIZED (
         SELECT inbox_id, position FROM rejections WHERE listed_at <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED)
       DELETE FROM rejections r USING k
       WHERE r.inbox_id = k.inbox_id AND r.position = k.position RETURNING 1`,
        [listedBefore, limit],
      ),
    );
    return rows.length;
  }

  async forgetProvisions(createdBefore: Date, limit: number): Promise<number> {
    const rows = await this.#batch((client) =>
      query(
        client,
        `WITH k AS MATERIALIZED (
         SELECT key_hash FROM provision_idempotency WHERE created_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED)
       DELETE FROM provision_idempotency p USING k
       WHERE p.key_hash = k.key_hash AND p.created_at < $1 RETURNING 1`,
        [createdBefore, limit],
      ),
    );
    return rows.length;
  }

  async releaseReservations(
    reservedBefore: Date,
    now: Date,
    limit: number,
  ): Promise<Freed & { inboxes: number }> {
    // The usage changes: the held-bytes trigger moves each inbox's version with its counter, locking the
    // inbox rows in key order as a reservation does (an update of the rows here, in hash order, could
    // deadlock with a reservation for two of them).
    const [row] = await this.#batch((client) =>
      query<{ messages: number; bytes: number; inboxes: number }>(
        client,
        `WITH due AS (
         SELECT inbox_id, message_id FROM messages WHERE state = 'in_flight' AND reserved_at <= $1
         LIMIT $3 FOR UPDATE SKIP LOCKED),
       released AS (
         UPDATE messages m SET state = 'deleted', deleted_reason = 'released', deleted_at = $2
         FROM due WHERE m.inbox_id = due.inbox_id AND m.message_id = due.message_id
         RETURNING m.inbox_id, m.size_bytes)
       SELECT count(*)::int AS messages, coalesce(sum(size_bytes), 0)::int8 AS bytes,
         count(DISTINCT inbox_id)::int AS inboxes
       FROM released`,
        [reservedBefore, now, limit],
      ),
    );
    return row ?? { messages: 0, bytes: 0, inboxes: 0 };
  }

  async dropRateBuckets(
    after: { inboxId: string; bucket: string } | null,
    now: Date,
    purgeCutoff: Date,
    limit: number,
  ): Promise<{ deleted: number; last: { inboxId: string; bucket: string } | null }> {
    const [row] = await this.#batch((client) =>
      query<{ deleted: number; seen: number; inbox_id: string; bucket: string }>(
        client,
        `WITH page AS (
         SELECT inbox_id, bucket FROM rate_buckets WHERE (inbox_id, bucket) > ($1, $2)
         ORDER BY inbox_id, bucket LIMIT $5),
       gone AS (
         DELETE FROM rate_buckets b USING page p
         WHERE b.inbox_id = p.inbox_id AND b.bucket = p.bucket
           AND NOT EXISTS (
             SELECT 1 FROM inboxes i WHERE i.inbox_id = b.inbox_id AND NOT (${purgeDue('$3', '$4')}))
         RETURNING 1),
       last AS (SELECT inbox_id, bucket FROM page ORDER BY inbox_id DESC, bucket DESC LIMIT 1)
       SELECT (SELECT count(*) FROM gone)::int AS deleted, (SELECT count(*) FROM page)::int AS seen,
         last.inbox_id, last.bucket
       FROM (SELECT 1) one LEFT JOIN last ON true`,
        [after?.inboxId ?? '', after?.bucket ?? '', now, purgeCutoff, limit],
      ),
    );
    const full = row !== undefined && row.seen === limit;
    return {
      deleted: row?.deleted ?? 0,
      last: full && row ? { inboxId: row.inbox_id, bucket: row.bucket } : null,
    };
  }
}

/** The leading rows whose sizes add up to at most `maxBytes`; always the first row. */
function withinBytes<T extends { size_bytes: number }>(rows: T[], maxBytes: number): T[] {
  let total = 0;
  let count = 0;
  for (const row of rows) {
    if (count > 0 && total + row.size_bytes > maxBytes) break;
    total += row.size_bytes;
    count++;
  }
  return rows.slice(0, count);
}

async function query<T = Record<string, unknown>>(
  client: pg.PoolClient,
  text: string,
  values: unknown[],
): Promise<T[]> {
  const params = values.map((value) => (value instanceof Date ? value.toISOString() : value));
  return (await client.query(text, params)).rows as T[];
}
