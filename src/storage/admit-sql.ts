/**
 * admit-sql - the gatekeeper's two statements (storage/gatekeeper.ts): ADMIT_SQL for one request,
 * ADMIT_BATCH_SQL for several (storage/admit-batch.ts). They take the same parameters (one value each,
 * or one array each) and return the same columns; the checks, the GCRA step and the usage aggregate are
 * written once below and used by both.
 *
 * GCRA: each bucket keeps one "theoretical arrival time", tat; a request is allowed when tat, after
 * adding one emission interval, is at most `burst` intervals ahead of now.
 */
import { INBOX_COLUMNS } from './rows.ts';
import { USAGE_WHERE } from './usage.ts';

/** Steps 3 to 5 as the core checks them: own inbox, not cancelled, role allowed, not purged. */
const eligible = (row: string, wantInbox: string, ownerOnly: string, purgeCutoff: string) =>
  `${row}.inbox_id = ${wantInbox} AND ${row}.cancelled_at IS NULL AND (NOT ${ownerOnly} OR ${row}.role = 'owner')
  AND ${row}.expires_at > ${purgeCutoff}`;

/** The bucket's tat after taking one token at `at`. */
const nextTat = (tat: string, at: string, secs: string) =>
  `greatest(${tat}, ${at}) + make_interval(secs => ${secs})`;

/** Taking one token leaves the bucket within its burst. */
const hasRoom = (tat: string, at: string, secs: string, burstSecs: string) =>
  `${nextTat(tat, at, secs)} <= ${at} + make_interval(secs => ${burstSecs})`;

/**
 * The inbox's usage as columns of `u`, read only when `wanted`. `wanted` mentions no column of
 * `messages`, so Postgres makes it a one-time filter and skips the scan altogether when it is false (as
 * a join condition it ran the aggregate and then discarded it).
 */
const usage = (wanted: string, row: string, at: string) => `CROSS JOIN LATERAL (
    SELECT count(*)::int AS message_count, coalesce(sum(size_bytes), 0)::int8 AS quota_used_bytes,
      min(delete_after) AS changes_at
    FROM messages
    WHERE ${wanted} AND ${USAGE_WHERE(`${row}.inbox_id`, `least(${at}, ${row}.expires_at)`)}
  ) u`;

/** Whether the usage is wanted: asked for, and not already held for this version. */
const WANTS_USAGE = '($9::boolean AND c.version IS DISTINCT FROM $10::int8)';
const ELIGIBLE = eligible('c', '$3', '$4::boolean', '$5::timestamptz');

/** One request; its first request for a bucket creates it. */
export const ADMIT_SQL = `
  WITH c AS (
    SELECT c.role, ${INBOX_COLUMNS}
    FROM credentials c JOIN inboxes i USING (inbox_id)
    WHERE c.credential_hash = $1
  ), take AS (
    INSERT INTO rate_buckets AS b (inbox_id, bucket, tat)
    SELECT c.inbox_id, $2, $6::timestamptz + make_interval(secs => $7) FROM c
    WHERE $2::text IS NOT NULL AND ${ELIGIBLE}
    ON CONFLICT (inbox_id, bucket) DO UPDATE
      SET tat = ${nextTat('b.tat', '$6::timestamptz', '$7')}
      WHERE ${hasRoom('b.tat', '$6::timestamptz', '$7', '$8')}
    RETURNING tat
  )
  SELECT c.*, (${ELIGIBLE}) AS eligible, t.tat AS taken_tat, ${WANTS_USAGE} AS with_usage,
    u.message_count, u.quota_used_bytes, u.changes_at
  FROM c LEFT JOIN take t ON true
  ${usage(WANTS_USAGE, 'c', '$6::timestamptz')}`;

/**
 * Several requests (r.n, 1-based, names each request's row; a request whose credential is unknown has
 * none). Only buckets that exist and have room are updated: see admit-batch.ts for the rest.
 */
export const ADMIT_BATCH_SQL = `
  WITH r AS (
    SELECT * FROM unnest($1::bytea[], $2::text[], $3::text[], $4::boolean[], $5::timestamptz[],
      $6::timestamptz[], $7::float8[], $8::float8[], $9::boolean[], $10::int8[]) WITH ORDINALITY
      AS r(credential_hash, want_bucket, want_inbox, owner_only, purge_cutoff, at, secs, burst_secs,
        usage_asked, known_version, n)
  ), c AS (
    SELECT r.n::int AS n, r.want_bucket, r.at, r.secs, r.burst_secs, k.*,
      (${eligible('k', 'r.want_inbox', 'r.owner_only', 'r.purge_cutoff')}) AS eligible,
      (r.usage_asked AND k.version IS DISTINCT FROM r.known_version) AS with_usage
    FROM r CROSS JOIN LATERAL (
      -- LIMIT 1 (the hash is unique) keeps this an index lookup per request, never a hash join.
      SELECT c.role, ${INBOX_COLUMNS} FROM credentials c JOIN inboxes i USING (inbox_id)
      WHERE c.credential_hash = r.credential_hash LIMIT 1
    ) k
  ), locked AS MATERIALIZED (
    -- The buckets in key order: two statements that lock several rows each then never wait on each
    -- other in a cycle (a deadlock), in this process or another.
    SELECT b.inbox_id, b.bucket FROM rate_buckets b JOIN c ON b.inbox_id = c.inbox_id AND b.bucket = c.want_bucket
    WHERE c.eligible
    ORDER BY b.inbox_id, b.bucket
    FOR UPDATE OF b
  ), take AS (
    UPDATE rate_buckets b SET tat = ${nextTat('b.tat', 'c.at', 'c.secs')}
    FROM c JOIN locked l ON l.inbox_id = c.inbox_id AND l.bucket = c.want_bucket
    WHERE c.eligible AND b.inbox_id = l.inbox_id AND b.bucket = l.bucket
      AND ${hasRoom('b.tat', 'c.at', 'c.secs', 'c.burst_secs')}
    RETURNING c.n, b.tat
  )
  SELECT c.n, c.role, ${INBOX_COLUMNS.replaceAll('i.', 'c.')}, c.eligible, t.tat AS taken_tat,
    c.with_usage, u.message_count, u.quota_used_bytes, u.changes_at
  FROM c LEFT JOIN take t ON t.n = c.n
  ${usage('c.with_usage', 'c', 'c.at')}`;
