/**
 * admit-batch - sends the gatekeeper's statements (admit-sql.ts) one or several requests at a time
 * (DESIGN decision 11 stays as it is: every token still comes out of the shared bucket in Postgres).
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
import { ADMIT_BATCH_SQL, ADMIT_SQL } from './admit-sql.ts';
import type { Database } from './database.ts';

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
  readonly #maxInFlight: number;
  readonly #maxBatch: number;
  #queue: Pending<Row>[] = [];
  #inFlight = 0;
  #scheduled = false;

  constructor(db: Database, maxInFlight = 4, maxBatch = 64) {
    this.#db = db;
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
      const [row] = await this.#db.rows<Row>('admit', ADMIT_SQL, pending.params);
      pending.resolve(row);
    } catch (error) {
      pending.reject(error);
    }
  }

  async #runBatch(batch: Pending<Row>[]): Promise<void> {
    const byRequest: (Row | undefined)[] = [];
    try {
      const columns = Array.from({ length: 10 }, (_, i) => batch.map((p) => p.params[i]));
      const rows = await this.#db.rows<Row & { n: number }>('admit-batch', ADMIT_BATCH_SQL, columns);
      for (const row of rows) byRequest[row.n - 1] = row;
    } catch (error) {
      // One request's parameters can fail the shared statement for all: a value Postgres refuses
      // (SQLSTATE class 22, a NUL in text, say), raised before anything ran. Then each runs alone, so
      // only that request gets the error. Any other failure (a lost connection, perhaps after the
      // commit; a timeout) fails the batch: running it again could take a token twice, and would
      // multiply the work against a database that is already failing.
      if (!String((error as { code?: unknown }).code ?? '').startsWith('22')) {
        for (const pending of batch) pending.reject(error);
        return;
      }
      await Promise.all(batch.map((pending) => this.#runSingle(pending)));
      return;
    }
    const retries: Promise<void>[] = [];
    batch.forEach((pending, i) => {
      const row = byRequest[i];
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
