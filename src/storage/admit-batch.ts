/**
 * admit-batch - the gatekeeper's statement for several requests at once (DESIGN decision 11 stays as
 * it is: every token still comes out of the shared bucket in Postgres, in a statement of its own
 * transaction).
 *
 * Why: per request, Postgres spent more on starting, committing and answering the gatekeeper statement
 * than on its index lookups and the bucket update, and the API process as much again on the round
 * trip. Requests that reach the gatekeeper in the same turn of the event loop go out as one statement
 * (the rows of ADMIT_BATCH_SQL), and while `maxInFlight` statements are out, later requests wait for
 * the next one: under load the batches grow by themselves; alone, a request goes out at once, as the
 * single-request ADMIT_SQL it always was.
 *
 * The batch statement only updates buckets that exist and have room. A request it could not serve
 * that way (eligible to take a token, but none taken: the inbox's first request, or a refusal) runs
 * ADMIT_SQL on its own, which creates the bucket or refuses atomically; so refusals and first requests
 * cost two statements, every other request a share of one. Two requests for the same inbox and bucket
 * never share a statement (an UPDATE changes a row once per statement); the later one waits for the
 * next batch. A batch locks its buckets in key order before updating them, so batches running at the
 * same time (here or in another API process) queue on a shared bucket instead of deadlocking.
 */
import type { Database } from './database.ts';
import { INBOX_COLUMNS } from './rows.ts';
import { USAGE_WHERE } from './usage.ts';

/** One request's parameters, in ADMIT_SQL's order ($1 to $10); Dates as ISO strings. */
export type AdmitParams = [
  credentialHash: Buffer,
  bucket: string | null,
  inboxId: string,
  ownerOnly: boolean,
  purgeCutoff: string,
  now: string,
  intervalSeconds: number,
  burstSeconds: number,
  withUsage: boolean,
  knownUsageVersion: number | null,
];

/** The same columns as ADMIT_SQL's row, for each request (r.n, 1-based) whose credential is known. */
export const ADMIT_BATCH_SQL = `
  WITH r AS (
    SELECT * FROM unnest($1::bytea[], $2::text[], $3::text[], $4::boolean[], $5::timestamptz[],
      $6::timestamptz[], $7::float8[], $8::float8[], $9::boolean[], $10::int8[]) WITH ORDINALITY
      AS r(credential_hash, want_bucket, want_inbox, owner_only, purge_cutoff, at, secs, burst_secs,
        usage_asked, known_version, n)
  ), c AS (
    SELECT r.n, r.want_bucket, r.at, r.secs, r.burst_secs, k.*,
      (k.inbox_id = r.want_inbox AND k.cancelled_at IS NULL AND (NOT r.owner_only OR k.role = 'owner')
        AND k.expires_at > r.purge_cutoff) AS eligible,
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
    UPDATE rate_buckets b SET tat = greatest(b.tat, c.at) + make_interval(secs => c.secs)
    FROM c JOIN locked l ON l.inbox_id = c.inbox_id AND l.bucket = c.want_bucket
    WHERE c.eligible AND b.inbox_id = l.inbox_id AND b.bucket = l.bucket
      AND greatest(b.tat, c.at) + make_interval(secs => c.secs) <= c.at + make_interval(secs => c.burst_secs)
    RETURNING c.n, b.tat
  )
  SELECT c.n, c.role, ${INBOX_COLUMNS.replaceAll('i.', 'c.')}, c.eligible, t.tat AS taken_tat,
    c.with_usage, u.message_count, u.quota_used_bytes, u.changes_at
  FROM c LEFT JOIN take t ON t.n = c.n
  CROSS JOIN LATERAL (
    SELECT count(*)::int AS message_count, coalesce(sum(size_bytes), 0)::int8 AS quota_used_bytes,
      min(delete_after) AS changes_at
    FROM messages
    WHERE c.with_usage AND ${USAGE_WHERE('c.inbox_id', 'least(c.at, c.expires_at)')}
  ) u`;

/** What both statements return per request: ADMIT_SQL's row (without n). */
export interface AdmitResultRow {
  eligible: boolean;
  taken_tat: Date | null;
}

interface Pending<Row> {
  params: AdmitParams;
  resolve(row: Row | undefined): void;
  reject(error: unknown): void;
}

export class AdmitBatcher<Row extends AdmitResultRow> {
  readonly #db: Database;
  readonly #singleSql: string;
  readonly #maxInFlight: number;
  readonly #maxBatch: number;
  #queue: Pending<Row>[] = [];
  #inFlight = 0;
  #scheduled = false;

  /** `singleSql` is ADMIT_SQL: the one-request statement, with the same parameters and columns. */
  constructor(db: Database, singleSql: string, maxInFlight = 4, maxBatch = 64) {
    this.#db = db;
    this.#singleSql = singleSql;
    this.#maxInFlight = maxInFlight;
    this.#maxBatch = maxBatch;
  }

  /** The request's row, or undefined when its credential is unknown. */
  admit(params: AdmitParams): Promise<Row | undefined> {
    return new Promise<Row | undefined>((resolve, reject) => {
      this.#queue.push({ params, resolve, reject });
      if (!this.#scheduled) {
        this.#scheduled = true;
        // After the requests parsed in this turn of the event loop have queued theirs.
        setImmediate(() => {
          this.#scheduled = false;
          this.#pump();
        });
      }
    });
  }

  #pump(): void {
    while (this.#inFlight < this.#maxInFlight && this.#queue.length > 0) {
      const batch = this.#nextBatch();
      this.#inFlight++;
      const sent = batch.length === 1 ? this.#runSingle(batch[0] as Pending<Row>) : this.#runBatch(batch);
      void sent.finally(() => {
        this.#inFlight--;
        this.#pump();
      });
    }
  }

  /** Takes up to maxBatch requests, in order, leaving a second one for the same inbox and bucket queued. */
  #nextBatch(): Pending<Row>[] {
    const batch: Pending<Row>[] = [];
    const rest: Pending<Row>[] = [];
    const buckets = new Set<string>();
    for (const pending of this.#queue) {
      const [, bucket, inboxId] = pending.params;
      const key = bucket === null ? null : `${inboxId} ${bucket}`;
      if (batch.length >= this.#maxBatch || (key !== null && buckets.has(key))) {
        rest.push(pending);
        continue;
      }
      if (key !== null) buckets.add(key);
      batch.push(pending);
    }
    this.#queue = rest;
    return batch;
  }

  async #runSingle(pending: Pending<Row>): Promise<void> {
    try {
      const [row] = await this.#db.rows<Row>('admit', this.#singleSql, pending.params);
      pending.resolve(row);
    } catch (error) {
      pending.reject(error);
    }
  }

  async #runBatch(batch: Pending<Row>[]): Promise<void> {
    let rows: (Row & { n: string })[];
    try {
      const columns = Array.from({ length: 10 }, (_, i) => batch.map((p) => p.params[i]));
      rows = await this.#db.rows<Row & { n: string }>('admit-batch', ADMIT_BATCH_SQL, columns);
    } catch (error) {
      for (const pending of batch) pending.reject(error);
      return;
    }
    const byRequest = new Map<number, Row>();
    for (const { n, ...row } of rows) byRequest.set(Number(n), row as unknown as Row);
    const retries: Promise<void>[] = [];
    batch.forEach((pending, i) => {
      const row = byRequest.get(i + 1);
      const [, bucket] = pending.params;
      // Eligible for a token but none taken: no bucket yet, or a refusal. The one-request statement
      // creates the bucket or refuses, in one step.
      if (row && bucket !== null && row.eligible && row.taken_tat === null)
        retries.push(this.#runSingle(pending));
      else pending.resolve(row);
    });
    await Promise.all(retries);
  }
}
