/**
 * gatekeeper - one round trip per request for contract section 4's checks 1 and 3 to 6: find the
 * credential's inbox and, only when the request may proceed, take a token from the inbox's rate
 * bucket (GCRA; the statements are in admit-sql.ts, sent one or several at a time by admit-batch.ts).
 * Optionally the
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
import { type InboxRow, toInbox } from './rows.ts';

export interface BucketSettings {
  burst: number;
  perSecond: number;
}

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
    this.#batcher = new AdmitBatcher<AdmitRow>(db);
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
