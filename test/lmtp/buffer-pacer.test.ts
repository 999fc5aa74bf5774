/**
 * paceBufferGarbage: once ArrayBuffer memory exceeds the least seen since its last full collection by
 * its headroom, it runs a young collection, and a full one if the next check still finds too much; the
 * garbage Buffers' memory comes back; below that, it never collects, however much of the memory is live.
 * Checks come every interval and every checkEveryBytes counted as received.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { type BufferPacer, paceBufferGarbage } from '../../src/lmtp/buffer-pacer.ts';

const MiB = 1024 * 1024;
const arrayBuffers = () => process.memoryUsage().arrayBuffers;

/** Allocates `mib` MiB of Buffers and drops them. */
function garbage(mib: number): number {
  let kept = 0;
  for (let i = 0; i < mib; i++) kept ^= Buffer.alloc(MiB, i)[0] ?? 0;
  return kept;
}

/** Buffers that survived a full collection (in the old generation now), returned still referenced. */
function promoted(mib: number): Buffer[] {
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as (options: { type: 'major' }) => void;
  const buffers = Array.from({ length: mib }, (_, i) => Buffer.alloc(MiB, i));
  gc({ type: 'major' });
  return buffers;
}

async function until(done: () => boolean, ms = 2000): Promise<void> {
  for (let waited = 0; !done() && waited < ms; waited += 10) await sleep(10);
}

const total = (pacer: BufferPacer) => pacer.youngCollections + pacer.fullCollections;

test('young garbage above the limit is freed by a young collection within a few intervals', async () => {
  // V8 may collect the garbage on its own before the pacer's first check (it did once in CI: freed
  // within 30 ms, no collection of the pacer's); then there is nothing left for the pacer to do, and
  // the scene is set again, up to five times. A pacer that never collects fails all five.
  for (let attempt = 1; ; attempt++) {
    const pacer = paceBufferGarbage(8 * MiB, 20);
    try {
      // 40 MiB of garbage: below the external growth (~64 MiB) at which V8 collects on its own.
      garbage(40);
      const before = arrayBuffers();
      assert.ok(before > 24 * MiB, `the garbage is still counted (${(before / MiB).toFixed(1)} MiB)`);
      await until(() => arrayBuffers() < 16 * MiB);
      assert.ok(arrayBuffers() < 16 * MiB, `freed: ${(arrayBuffers() / MiB).toFixed(1)} MiB left`);
      if (pacer.youngCollections === 0 && attempt < 5) continue;
      assert.ok(pacer.youngCollections >= 1, `a young collection ran (attempt ${attempt})`);
      assert.equal(pacer.fullCollections, 0, 'and was enough');
      return;
    } finally {
      pacer.stop();
    }
  }
});

test('promoted garbage: the young collection cannot free it, the next check runs a full one', async () => {
  let old: Buffer[] = promoted(30);
  const pacer = paceBufferGarbage(8 * MiB, 20);
  try {
    const before = arrayBuffers();
    old = [];
    await until(() => pacer.fullCollections >= 1);
    assert.ok(pacer.youngCollections >= 1, 'a young collection came first');
    assert.ok(pacer.fullCollections >= 1, 'then a full one');
    await until(() => arrayBuffers() < before - 20 * MiB);
    assert.ok(arrayBuffers() < before - 20 * MiB, `freed: ${(arrayBuffers() / MiB).toFixed(1)} MiB left`);
    assert.equal(old.length, 0);
  } finally {
    pacer.stop();
  }
});

test('below the limit it never collects', async () => {
  const pacer = paceBufferGarbage(1024 * MiB, 10);
  try {
    await sleep(100);
    assert.equal(total(pacer), 0);
  } finally {
    pacer.stop();
  }
});

test('live Buffers above the headroom: it measures from them, and garbage beyond it is freed again', async () => {
  const live = promoted(20);
  // Checks only when told: one per received MiB.
  const pacer = paceBufferGarbage(8 * MiB, 3_600_000, MiB);
  const check = () => pacer.received(MiB);
  try {
    check();
    check();
    assert.deepEqual([pacer.youngCollections, pacer.fullCollections], [1, 1], 'young, then full');
    await sleep(50);
    // 20 MiB live, some garbage: a fixed 8 MiB limit would collect at every check from here on.
    garbage(3);
    for (let i = 0; i < 5; i++) check();
    assert.deepEqual([pacer.youngCollections, pacer.fullCollections], [1, 1], 'under the headroom');
    // New garbage that only a full collection frees: a young one first, then the full one.
    let old: Buffer[] = promoted(12);
    old = [];
    check();
    assert.deepEqual([pacer.youngCollections, pacer.fullCollections], [2, 1], 'young first');
    check();
    assert.deepEqual([pacer.youngCollections, pacer.fullCollections], [2, 2], 'then full');
    await until(() => arrayBuffers() < 28 * MiB);
    assert.ok(arrayBuffers() < 28 * MiB, `freed: ${(arrayBuffers() / MiB).toFixed(1)} MiB left`);
    assert.equal(old.length, 0);
    assert.equal(live.length, 20);
  } finally {
    pacer.stop();
  }
});

test('bytes received trigger a check at once, without waiting for the interval', () => {
  const pacer = paceBufferGarbage(8 * MiB, 3_600_000, 4 * MiB);
  try {
    garbage(12);
    pacer.received(3 * MiB);
    assert.equal(total(pacer), 0, 'under checkEveryBytes: no check yet');
    pacer.received(1 * MiB);
    assert.equal(pacer.youngCollections, 1, 'the fourth MiB checks and collects');
  } finally {
    pacer.stop();
  }
});
