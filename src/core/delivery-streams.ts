/**
 * delivery-streams - the stream plumbing of one delivery (core/delivery-service.ts): read the header
 * block first, hand every later piece to N stores at once, and bound how many stores run.
 *
 * Invariants:
 * - nothing here ever calls `return()` on the message iterator: ending it early would destroy the
 *   protocol's stream. The owner reads it to the end (BodyTee.drain) instead;
 * - memory is bounded by the header buffer plus one incoming piece, whatever the message size and N;
 * - every promise made from the source is observed, so a source error never becomes an unhandled
 *   rejection; it reaches every branch that reads on.
 */
import { headerBlockLength } from './message-summary.ts';

export interface Head {
  /** The bytes read so far: the header block, maybe some body, at most `maxBytes`. */
  bytes: Buffer;
  /** Bytes of the last piece read that did not fit into `bytes`. */
  leftover: Buffer | null;
  /** The source ended while reading the head. */
  done: boolean;
}

/**
 * Reads from `source` until the header block's blank line is in, `maxBytes` are read, or the source
 * ends. When the first piece holds the whole header block (most mail) its bytes are not copied at all;
 * otherwise they go into a buffer that doubles as needed up to `maxBytes`, so each byte is copied at
 * most about twice and a small message never costs a `maxBytes` buffer. (Allocating `maxBytes`, 256 KiB,
 * per delivery made the receiver's garbage collector run on worker threads as much as its main thread
 * did in the 10 KiB mail benchmark.)
 */
export async function readHead(source: AsyncIterator<Buffer>, maxBytes: number): Promise<Head> {
  let bytes: Buffer = Buffer.alloc(0);
  let buffer: Buffer | undefined;
  for (;;) {
    const next = await source.next();
    if (next.done) return { bytes, leftover: null, done: true };
    const piece = next.value;
    const searchedUpTo = bytes.length;
    const take = Math.min(piece.length, maxBytes - bytes.length);
    if (bytes.length === 0) {
      bytes = piece.subarray(0, take);
    } else {
      const filled = bytes.length + take;
      if (buffer === undefined || buffer.length < filled) {
        const grown = Buffer.allocUnsafe(Math.min(maxBytes, Math.max(filled, 2 * bytes.length)));
        bytes.copy(grown);
        buffer = grown;
      }
      piece.copy(buffer, bytes.length, 0, take);
      bytes = buffer.subarray(0, filled);
    }
    const leftover = take < piece.length ? piece.subarray(take) : null;
    if (leftover || bytes.length === maxBytes || headerBlockLength(bytes, searchedUpTo) !== -1) {
      return { bytes, leftover, done: false };
    }
  }
}

/**
 * Reads on past `head` until `limit` bytes are in or the source ends: the head it returns holds them
 * all (no leftover). Its use: a message that fits in one store chunk is read whole before it takes a
 * store slot, so a peer that stalls in the middle of one holds no slot (core/delivery-service.ts).
 */
export async function readAhead(head: Head, source: AsyncIterator<Buffer>, limit: number): Promise<Head> {
  if (head.done || head.bytes.length + (head.leftover?.length ?? 0) >= limit) return head;
  const pieces = [head.bytes, ...(head.leftover ? [head.leftover] : [])];
  let length = pieces.reduce((sum, piece) => sum + piece.length, 0);
  let done = false;
  while (length < limit) {
    const next = await source.next();
    if (next.done) {
      done = true;
      break;
    }
    pieces.push(next.value);
    length += next.value.length;
  }
  return {
    bytes: pieces.length === 1 ? (pieces[0] as Buffer) : Buffer.concat(pieces, length),
    leftover: null,
    done,
  };
}

/** Thrown to a branch that kept the others waiting longer than the stall bound. */
export class StalledError extends Error {
  constructor(ms: number) {
    super(`store fell behind the other recipients' stores for ${ms} ms`);
  }
}

export interface BodyTee {
  /** One iterable per store; each yields every piece of the message, in order. */
  branches: AsyncIterable<Buffer>[];
  /** The store behind branch i is finished (however): it no longer holds the others back. */
  detach(i: number): void;
  /** After every branch is detached: reads the source to its end; never rejects. */
  drain(): Promise<void>;
  /** Bytes the source yielded so far. */
  readonly bytes: number;
}

/**
 * Hands each piece of `source` (after `head` and `leftover`) to `count` branches. The next piece is
 * pulled only when every live branch has taken the current one, so one piece is held whatever `count`.
 * A branch that has not taken the current piece while another waits for `stallMs` is cut off (its next
 * read throws StalledError) so the others go on: nothing waits forever on one store (a lock, a pool).
 */
export function teeBody(
  head: Head,
  source: AsyncIterator<Buffer>,
  count: number,
  stallMs: number,
  onStall: (branch: number) => void,
): BodyTee {
  const prefix = [head.bytes, head.leftover].filter((b): b is Buffer => b !== null && b.length > 0);
  let bytes = 0;
  let ended = head.done;
  const pull = async (): Promise<IteratorResult<Buffer>> => {
    const next = prefix.shift();
    if (next !== undefined) {
      bytes += next.length;
      return { value: next, done: false };
    }
    if (ended) return { value: undefined, done: true };
    const result = await source.next();
    if (result.done) ended = true;
    else bytes += result.value.length;
    return result;
  };
  const observe = (p: Promise<IteratorResult<Buffer>>) => {
    p.catch(() => {});
    return p;
  };

  let current = observe(pull());
  let generation = 0;
  const live = new Set(Array.from({ length: count }, (_, i) => i));
  const taken = new Set<number>();
  const cut = new Set<number>();
  let wake: () => void = () => {};
  let changed = new Promise<void>((resolve) => (wake = resolve));
  const signal = () => {
    wake();
    changed = new Promise<void>((resolve) => (wake = resolve));
  };
  const leave = (i: number) => {
    if (live.delete(i)) {
      taken.delete(i);
      signal();
    }
  };

  const read = async (i: number, want: number): Promise<IteratorResult<Buffer>> => {
    for (;;) {
      if (cut.has(i)) throw new StalledError(stallMs);
      if (want === generation) {
        taken.add(i);
        const result = await current;
        if (result.done) leave(i);
        return result;
      }
      if ([...live].every((b) => taken.has(b))) {
        generation++;
        taken.clear();
        current = observe(pull());
        signal();
        continue;
      }
      const waitingFor = generation;
      let timer: NodeJS.Timeout | undefined;
      const stalled = new Promise<boolean>((resolve) => {
        timer = setTimeout(() => resolve(true), stallMs);
      });
      const timedOut = await Promise.race([changed.then(() => false), stalled]);
      clearTimeout(timer);
      if (timedOut && generation === waitingFor) {
        for (const b of [...live]) {
          if (taken.has(b)) continue;
          cut.add(b);
          leave(b);
          onStall(b);
        }
      }
    }
  };

  const branch = (i: number): AsyncIterable<Buffer> => ({
    [Symbol.asyncIterator]() {
      let want = 0;
      return {
        next: async () => {
          const result = await read(i, want);
          want++;
          return result;
        },
        return: async () => {
          leave(i);
          return { value: undefined, done: true };
        },
      };
    },
  });

  return {
    branches: Array.from({ length: count }, (_, i) => branch(i)),
    detach: leave,
    get bytes() {
      return bytes;
    },
    async drain() {
      try {
        for (let result = await current; !result.done; result = await pull()) {
          // discard: the rest of the message must still be read off the connection
        }
      } catch {
        // the source failed: there is nothing left to read
      }
    },
  };
}

/** A counting semaphore, first come first served; a request takes all its slots at once. */
export class Slots {
  readonly size: number;
  #free: number;
  readonly #waiting: { n: number; resolve: () => void }[] = [];

  constructor(size: number) {
    this.size = size;
    this.#free = size;
  }

  /** Waits for `n` (at most `size`) slots. */
  async acquire(n: number): Promise<void> {
    if (n === 0) return;
    if (this.#waiting.length === 0 && this.#free >= n) {
      this.#free -= n;
      return;
    }
    await new Promise<void>((resolve) => this.#waiting.push({ n, resolve }));
  }

  release(n: number): void {
    this.#free += n;
    for (let next = this.#waiting[0]; next && next.n <= this.#free; next = this.#waiting[0]) {
      this.#waiting.shift();
      this.#free -= next.n;
      next.resolve();
    }
  }
}
