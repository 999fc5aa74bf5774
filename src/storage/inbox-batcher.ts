/**
 * inbox-batcher - runs a per-inbox statement with at most one in flight per inbox: work for an inbox
 * with none in flight goes out at once, on its own; work for that inbox arriving meanwhile waits here
 * and goes out together, as one batch statement, when the one in flight returns.
 *
 * Why: the mail path's writes (the milter's reservation, the receiver's store) each lock the inbox row
 * and keep the lock until their commit is on disk. Concurrent writes for one inbox queued on that lock
 * inside Postgres, at a CPU cost that grew with the queue (measured: 20 concurrent 10 KiB stores to one
 * inbox cost Postgres 2.6 ms each, against 0.7 alone, and the inbox took at most about 360 a second).
 * Waiting here instead, they share one lock, one commit and one disk flush. Different inboxes run side
 * by side (the pool bounds them), and a batch never spans inboxes, so batches cannot deadlock on each
 * other.
 *
 * Contracts:
 * - Work for one inbox runs in arrival order: the batch statement must handle its items in the order
 *   given, each as the single statement would, and return one result per item.
 * - A batch is one statement, so one transaction. When it fails, nothing of it happened, and each item
 *   is run again on its own, one after another: an item Postgres refuses fails only itself.
 * - A batch carries at most `maxBatch` items and, beyond its first, `maxBatchBytes` of `bytes(item)`.
 * - A statement still out after `laneTimeoutMs` no longer holds its inbox's lane: what waits goes out
 *   beside it. A statement that never returns (a connection that died silently) then stalls only its
 *   own items, as it did before batching, not every later delivery to that inbox.
 */

export interface BatchStatements<Item, Result> {
  single(item: Item): Promise<Result>;
  /** One result per item, in the items' order. */
  batch(items: Item[]): Promise<Result[]>;
  /** What an item weighs against maxBatchBytes. */
  bytes?(item: Item): number;
}

interface Pending<Item, Result> {
  item: Item;
  resolve(result: Result): void;
  reject(error: unknown): void;
}

export class InboxBatcher<Item, Result> {
  readonly #statements: BatchStatements<Item, Result>;
  readonly #maxBatch: number;
  readonly #maxBatchBytes: number;
  /** Work waiting, per inbox with a statement in flight. */
  readonly #waiting = new Map<string, Pending<Item, Result>[]>();
  readonly #inFlight = new Set<string>();
  /** Statements sent and the items they carried, for tests and benchmarks. */
  readonly counts = { statements: 0, items: 0 };

  readonly #laneTimeoutMs: number;

  constructor(
    statements: BatchStatements<Item, Result>,
    { maxBatch = 64, maxBatchBytes = 4 * 1024 * 1024, laneTimeoutMs = 30_000 } = {},
  ) {
    this.#statements = statements;
    this.#maxBatch = maxBatch;
    this.#maxBatchBytes = maxBatchBytes;
    this.#laneTimeoutMs = laneTimeoutMs;
  }

  run(inboxId: string, item: Item): Promise<Result> {
    return new Promise<Result>((resolve, reject) => {
      const pending = { item, resolve, reject };
      if (!this.#inFlight.has(inboxId)) {
        this.#send(inboxId, [pending]);
        return;
      }
      const queue = this.#waiting.get(inboxId);
      if (queue) queue.push(pending);
      else this.#waiting.set(inboxId, [pending]);
    });
  }

  #send(inboxId: string, batch: Pending<Item, Result>[]): void {
    this.#inFlight.add(inboxId);
    this.counts.statements++;
    this.counts.items += batch.length;
    let released = false;
    const release = () => {
      if (released) return;
      released = true;
      clearTimeout(timer);
      this.#inFlight.delete(inboxId);
      const next = this.#take(inboxId);
      if (next.length > 0) this.#send(inboxId, next);
    };
    const timer = setTimeout(release, this.#laneTimeoutMs);
    timer.unref();
    // #runSingle and #runBatch settle their items themselves and never reject.
    const sent =
      batch.length === 1 ? this.#runSingle(batch[0] as Pending<Item, Result>) : this.#runBatch(batch);
    void sent.then(release);
  }

  /** The inbox's next batch, in arrival order, within the bounds. */
  #take(inboxId: string): Pending<Item, Result>[] {
    const queue = this.#waiting.get(inboxId);
    if (!queue) return [];
    let bytes = 0;
    let count = 0;
    for (const pending of queue) {
      bytes += this.#statements.bytes?.(pending.item) ?? 0;
      if (count > 0 && (count >= this.#maxBatch || bytes > this.#maxBatchBytes)) break;
      count++;
    }
    const batch = queue.splice(0, count);
    if (queue.length === 0) this.#waiting.delete(inboxId);
    return batch;
  }

  async #runSingle(pending: Pending<Item, Result>): Promise<void> {
    try {
      pending.resolve(await this.#statements.single(pending.item));
    } catch (error) {
      pending.reject(error);
    }
  }

  async #runBatch(batch: Pending<Item, Result>[]): Promise<void> {
    let results: Result[];
    try {
      results = await this.#statements.batch(batch.map((p) => p.item));
      if (results.length !== batch.length)
        throw new Error(`a batch of ${batch.length} returned ${results.length} results`);
    } catch {
      // Nothing of the batch happened: each item on its own, so a bad one fails alone.
      this.counts.statements += batch.length;
      for (const pending of batch) await this.#runSingle(pending);
      return;
    }
    for (const [i, pending] of batch.entries()) pending.resolve(results[i] as Result);
  }
}

/** A batch statement's rows, numbered n = 1..count, put in that order; throws when one is missing. */
export function inOrder<Row extends { n: number }>(rows: Row[], count: number): Row[] {
  const ordered: Row[] = [];
  for (const row of rows) ordered[row.n - 1] = row;
  for (let i = 0; i < count; i++) if (!ordered[i]) throw new Error(`no row for item ${i + 1} of ${count}`);
  return ordered;
}
