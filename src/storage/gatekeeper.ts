/**
 * gatekeeper - one round trip per request for contract section 4's checks 1 and 3 to 6: find the
 * credential's inbox and, only when the request may proceed, take a token from the inbox's rate
 * bucket (GCRA: each bucket keeps one "theoretical arrival time", tat; a request is allowed when tat,
 * after adding one emission interval, is at most `burst` intervals ahead of now). Optionally the
 * inbox's usage comes back in the same statement, unless the caller already holds it for the inbox's
 * current version (core/usage-cache.ts).
 *
 * The statement takes a token only when the core's own checks will pass (own inbox, not cancelled,
 * role allowed, not purged); the core re-checks every one of them on the returned row and treats any
 * disagreement as an internal error, so a wrong credential can never consume a token (DESIGN 11).
 * Buckets live in an UNLOGGED table: no WAL flush per request; a crash only forgives some requests.
 */
import type { Admission, AdmissionRequest, Bucket, Gatekeeper } from '../core/ports.ts';
import { AdmitBatcher } from './admit-batch.ts';
import type { Database } from './database.ts';
import { INBOX_COLUMNS, type InboxRow, toInbox } from './rows.ts';
import { USAGE_WHERE } from './usage.ts';

export interface BucketSettings {
  burst: number;
  perSecond: number;
}

/** Steps 3 to 5 as the core checks them: own inbox, not cancelled, role allowed, not purged. */
const ELIGIBLE = `c.inbox_id = $3 AND c.cancelled_at IS NULL AND (NOT $4::boolean OR c.role = 'owner')
  AND c.expires_at > $5::timestamptz`;

/**
 * Whether the usage is wanted: asked for, and not already held for this version. Inside the lateral
 * subquery it mentions no column of `messages`, so Postgres makes it a one-time filter and skips the
 * scan altogether when it is false (as a join condition it ran the aggregate and then discarded it).
 */
const WANTS_USAGE = '($9::boolean AND c.version IS DISTINCT FROM $10::int8)';

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
      SET tat = greatest(b.tat, $6::timestamptz) + make_interval(secs => $7)
      WHERE greatest(b.tat, $6::timestamptz) + make_interval(secs => $7) <= $6::timestamptz + make_interval(secs => $8)
    RETURNING tat
  )
  SELECT c.*, (${ELIGIBLE}) AS eligible, t.tat AS taken_tat, ${WANTS_USAGE} AS with_usage,
    u.message_count, u.quota_used_bytes, u.changes_at
  FROM c LEFT JOIN take t ON true
  CROSS JOIN LATERAL (
    SELECT count(*)::int AS message_count, coalesce(sum(size_bytes), 0)::int8 AS quota_used_bytes,
      min(delete_after) AS changes_at
    FROM messages
    WHERE ${WANTS_USAGE} AND ${USAGE_WHERE('c.inbox_id', 'least($6::timestamptz, c.expires_at)')}
  ) u`;

type AdmitRow = InboxRow & {
  role: 'owner' | 'reader';
  eligible: boolean;
  taken_tat: Date | null;
  /** The aggregate always gives a row; its counts mean something only when with_usage. */
  with_usage: boolean;
  message_count: number;
  quota_used_bytes: number;
  changes_at: Date | null;
};

export class PgGatekeeper implements Gatekeeper {
  readonly #db: Database;
  readonly #buckets: Record<Bucket, BucketSettings>;
  readonly #batcher: AdmitBatcher<AdmitRow>;

  constructor(db: Database, buckets: Record<Bucket, BucketSettings>) {
    this.#db = db;
    this.#buckets = buckets;
    this.#batcher = new AdmitBatcher<AdmitRow>(db, ADMIT_SQL);
  }

  async admit(request: AdmissionRequest): Promise<Admission | undefined> {
    const bucket = request.take ? request.bucket : null;
    const settings = this.#buckets[request.bucket ?? 'poll'];
    const interval = 1 / settings.perSecond;
    const row = await this.#batcher.admit([
      request.credentialHash,
      bucket,
      request.inboxId,
      request.ownerOnly,
      request.purgeCutoff.toISOString(),
      request.now.toISOString(),
      interval,
      settings.burst * interval,
      request.withUsage,
      request.knownUsageVersion,
    ]);
    if (!row) return undefined;
    const admission: Admission = { role: row.role, inbox: toInbox(row), bucket: 'skipped' };
    if (row.with_usage) {
      admission.usage = {
        messageCount: row.message_count,
        quotaUsedBytes: row.quota_used_bytes,
        changesAt: row.changes_at,
      };
    }
    if (bucket && row.taken_tat) admission.bucket = 'taken';
    else if (bucket && row.eligible) {
      // Refused (the rare path): read the bucket to say when a token is due.
      const [current] = await this.#db.rows<{ tat: Date }>(
        'rate-bucket-read',
        'SELECT tat FROM rate_buckets WHERE inbox_id = $1 AND bucket = $2',
        [row.inbox_id, bucket],
      );
      // Allowed again once tat + interval - now <= burst * interval.
      const tat = current?.tat.getTime() ?? request.now.getTime();
      const waitMs = tat + (1 - settings.burst) * interval * 1000 - request.now.getTime();
      admission.bucket = 'refused';
      admission.retryAfterSeconds = Math.max(1, Math.ceil(waitMs / 1000));
    }
    return admission;
  }
}
