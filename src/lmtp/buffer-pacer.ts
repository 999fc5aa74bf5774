/**
 * buffer-pacer - keeps the receiver's garbage Buffers from piling up between V8's collections.
 *
 * Storing a 256 KiB chunk makes about 1 MiB of short-lived Buffers: socket reads, our chunk, then
 * node-postgres serializing the bind parameters (pg-protocol's writers grow and reallocate per message).
 * Those live outside V8's heap, and V8 collects them only when external memory has grown by some 64 MiB
 * since the last collection: ten 25 MiB deliveries at once grew the receiver's RSS by 65-75 MiB.
 * Every intervalMs this checks the process's ArrayBuffer memory and runs a full collection once it
 * exceeds the least seen since the previous one by headroomBytes. A young-generation collection freed nothing
 * here: by the time they are garbage, the Buffers' owners have been promoted.
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
  stop(): void;
  /** Collections run so far (metrics, tests). */
  readonly collections: number;
}

export function paceBufferGarbage(headroomBytes = 16 * 1024 * 1024, intervalMs = 50): BufferPacer {
  const gc = collector();
  let collections = 0;
  // The least ArrayBuffer memory seen since the last collection: the deliveries' live Buffers, plus
  // what arrived since. Read right after a collection it is too high (V8 frees the dead ArrayBuffers
  // on a helper thread, a little later), so each interval may lower it.
  let floor = 0;
  const timer = setInterval(() => {
    const now = process.memoryUsage().arrayBuffers;
    floor = Math.min(floor, now);
    if (now > floor + headroomBytes) {
      gc({ type: 'major' });
      collections++;
      floor = process.memoryUsage().arrayBuffers;
    }
  }, intervalMs);
  timer.unref();
  return {
    stop: () => clearInterval(timer),
    get collections() {
      return collections;
    },
  };
}
