/**
 * rate-limiter - per-inbox token buckets in Postgres (DESIGN decision 11), as GCRA: each bucket keeps one
 * "theoretical arrival time" (tat). A request is allowed when, after adding one emission interval,
 * tat is at most `burst` intervals ahead of now. One statement takes a token or refuses; only a refusal
 * pays a second read to say how long to wait.
 */
import type { Bucket, RateLimiter } from '../core/ports.ts';
import type { Database } from './database.ts';

export interface BucketSettings {
  burst: number;
  perSecond: number;
}

const TAKE_SQL = `
  INSERT INTO rate_buckets AS b (inbox_id, bucket, tat) VALUES ($1, $2, $3::timestamptz + make_interval(secs => $4))
  ON CONFLICT (inbox_id, bucket) DO UPDATE
    SET tat = greatest(b.tat, $3::timestamptz) + make_interval(secs => $4)
    WHERE greatest(b.tat, $3::timestamptz) + make_interval(secs => $4) <= $3::timestamptz + make_interval(secs => $5)
  RETURNING tat`;

export class PgRateLimiter implements RateLimiter {
  readonly #db: Database;
  readonly #settings: Record<Bucket, BucketSettings>;

  constructor(db: Database, settings: Record<Bucket, BucketSettings>) {
    this.#db = db;
    this.#settings = settings;
  }

  async take(inboxId: string, bucket: Bucket, now: Date) {
    const { burst, perSecond } = this.#settings[bucket];
    const interval = 1 / perSecond;
    const taken = await this.#db.rows('rate-take', TAKE_SQL, [
      inboxId,
      bucket,
      now,
      interval,
      burst * interval,
    ]);
    if (taken.length > 0) return { allowed: true as const };
    const [row] = await this.#db.rows<{ tat: Date }>(
      'rate-peek',
      'SELECT tat FROM rate_buckets WHERE inbox_id = $1 AND bucket = $2',
      [inboxId, bucket],
    );
    // Allowed again once tat + interval - now <= burst * interval.
    const waitMs =
      (row ? row.tat.getTime() : now.getTime()) + interval * 1000 - burst * interval * 1000 - now.getTime();
    return { allowed: false as const, retryAfterSeconds: Math.max(1, Math.ceil(waitMs / 1000)) };
  }
}
