/**
 * buffer-pacer - keeps the receiver's garbage Buffers from piling up between V8's collections.
 *
 * Every piece of a message read from the network is a Buffer whose memory lives outside V8's heap;
 * once its bytes are on their way to Postgres it is garbage. V8 collects such memory only when it has
 * grown by some 64 MiB since the last collection: ten 25 MiB deliveries at once grew the receiver's
 * RSS by 65-75 MiB. So every intervalMs, and every checkEveryBytes read from the network, this checks
 * the process's ArrayBuffer memory; once it exceeds the least seen since the last full collection by
 * headroomBytes, it runs a young-generation collection, and if the next check still finds too much, a
 * full one. The byte count bounds the garbage however fast it comes (after a collection's pause the
 * kernel hands over what piled up meanwhile: tens of MiB within one interval at 140 MiB/s); the young
 * collection first is the cheap case (the receiver's V8 flags, src/heap-flags.ts, make scavenges rare,
 * so the Buffers are mostly still young): 1 MiB mail-bench, receiver 7.5 -> 5 ms per message; ten
 * 25 MiB deliveries, RSS growth 33-37 MiB.
 *
 * The threshold is relative on purpose: with many deliveries in progress the live Buffers alone can
 * exceed any fixed limit, and a fixed limit then collected every interval (stop 8's version cost the
 * 1 MiB benchmark a third of the receiver's CPU). Idle or with small mail it never collects at all.
 */
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

type Collect = (options?: { type?: 'minor' | 'major' }) => void;

let collect: Collect | undefined;

function collector(): Collect {
  if (!collect) {
    // --expose-gc set at runtime reaches contexts created after it: a fresh one hands over gc().
    setFlagsFromString('--expose-gc');
    collect = runInNewContext('gc') as Collect;
  }
  return collect;
}

export interface BufferPacer {
  /** Counts bytes read from the network; every checkEveryBytes of them it checks at once. */
  received(bytes: number): void;
  stop(): void;
  /** Collections run so far (metrics, tests). */
  readonly youngCollections: number;
  readonly fullCollections: number;
}

const MiB = 1024 * 1024;

export function paceBufferGarbage(
  headroomBytes = 16 * MiB,
  intervalMs = 50,
  checkEveryBytes = 4 * MiB,
): BufferPacer {
  const gc = collector();
  let young = 0;
  let full = 0;
  // The least ArrayBuffer memory seen since the last collection: the deliveries' live Buffers, plus
  // what arrived since. Read right after a collection it can be too high (V8 may free the dead
  // ArrayBuffers on a helper thread, a little later), so each check may lower it.
  let floor = 0;
  // A young-generation collection first: with few scavenges (a small JS heap, V8 flags in
  // src/heap-flags.ts) the garbage Buffers are mostly still young, and a minor collection frees them
  // for a fraction of a full one. Only if the next check still finds too much, a full collection.
  let triedMinor = false;
  const check = () => {
    const now = process.memoryUsage().arrayBuffers;
    floor = Math.min(floor, now);
    if (now <= floor + headroomBytes) {
      triedMinor = false;
      return;
    }
    if (!triedMinor) {
      gc({ type: 'minor' });
      young++;
      triedMinor = true;
      return;
    }
    gc({ type: 'major' });
    full++;
    triedMinor = false;
    floor = process.memoryUsage().arrayBuffers;
  };
  const timer = setInterval(check, intervalMs);
  timer.unref();
  let unchecked = 0;
  return {
    received(bytes) {
      unchecked += bytes;
      if (unchecked >= checkEveryBytes) {
        unchecked = 0;
        check();
      }
    },
    stop: () => clearInterval(timer),
    get youngCollections() {
      return young;
    },
    get fullCollections() {
      return full;
    },
  };
}
