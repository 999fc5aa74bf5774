/**
 * buffer-pacer - keeps the receiver's garbage Buffers from piling up between V8's collections.
 *
 * Storing a 256 KiB chunk makes about 1 MiB of short-lived Buffers: our chunk, then node-postgres
 * serializing the bind parameters twice (pg-protocol's writers grow and reallocate per message). Those
 * live outside V8's heap, and V8 collects them only when external memory has grown by some 64 MiB
 * since the last collection: ten 25 MiB deliveries at once grew the receiver's RSS by ~75 MiB, of
 * which ~30 MiB was live. Every intervalMs this checks the process's ArrayBuffer memory and, above
 * limitBytes, runs a young-generation collection (a scavenge: the garbage Buffers are young), which
 * takes well under a millisecond with the receiver's small heap. Idle or with small mail it never
 * collects at all.
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

export function paceBufferGarbage(limitBytes = 24 * 1024 * 1024, intervalMs = 50): BufferPacer {
  const gc = collector();
  let collections = 0;
  const timer = setInterval(() => {
    if (process.memoryUsage().arrayBuffers > limitBytes) {
      gc({ type: 'major' });
      collections++;
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
