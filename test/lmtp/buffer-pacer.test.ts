/**
 * paceBufferGarbage: once ArrayBuffer memory exceeds the least seen since its last collection by its headroom
 * it collects, and the garbage Buffers' memory comes back; below that, it never collects, however much
 * of the memory is live.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { paceBufferGarbage } from '../../src/lmtp/buffer-pacer.ts';

const MiB = 1024 * 1024;

test('garbage Buffers above the limit are collected within a few intervals', async () => {
  const pacer = paceBufferGarbage(8 * MiB, 20);
  try {
    let kept = 0;
    // 40 MiB of garbage: below the external growth (~64 MiB) at which V8 collects on its own.
    for (let i = 0; i < 40; i++) kept ^= Buffer.alloc(MiB, i)[0] ?? 0;
    const before = process.memoryUsage().arrayBuffers;
    assert.ok(before > 24 * MiB, `the garbage is still counted (${(before / MiB).toFixed(1)} MiB)`);
    for (let waited = 0; pacer.collections === 0 && waited < 2000; waited += 20) await sleep(20);
    assert.ok(pacer.collections >= 1, 'collected');
    const after = process.memoryUsage().arrayBuffers;
    assert.ok(
      after < 16 * MiB,
      `freed: ${(after / MiB).toFixed(1)} MiB left of ${(before / MiB).toFixed(1)}`,
    );
    assert.equal(typeof kept, 'number');
  } finally {
    pacer.stop();
  }
});

test('below the limit it never collects', async () => {
  const pacer = paceBufferGarbage(1024 * MiB, 10);
  try {
    await sleep(100);
    assert.equal(pacer.collections, 0);
  } finally {
    pacer.stop();
  }
});

test('live Buffers above the headroom do not make it collect again until new garbage exceeds it', async () => {
  const live: Buffer[] = [];
  for (let i = 0; i < 20; i++) live.push(Buffer.alloc(MiB, i));
  const pacer = paceBufferGarbage(8 * MiB, 10);
  const garbage = (mib: number) => {
    let kept = 0;
    for (let i = 0; i < mib; i++) kept ^= Buffer.alloc(MiB, i)[0] ?? 0;
    return kept;
  };
  const waitFor = async (count: number) => {
    for (let waited = 0; pacer.collections < count && waited < 2000; waited += 10) await sleep(10);
  };
  try {
    garbage(12);
    await waitFor(1);
    assert.equal(pacer.collections, 1, 'the first excess is collected');
    // 20 MiB live, some garbage: a fixed 8 MiB limit would collect every interval from here on.
    garbage(3);
    await sleep(150);
    assert.equal(pacer.collections, 1, 'no collection while garbage stays under the headroom');
    garbage(12);
    await waitFor(2);
    assert.equal(pacer.collections, 2, 'new garbage beyond the headroom is collected');
    assert.equal(live.length, 20);
  } finally {
    pacer.stop();
  }
});
