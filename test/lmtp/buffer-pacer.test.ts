/**
 * paceBufferGarbage: above its limit of ArrayBuffer memory it collects, and the garbage Buffers'
 * memory comes back; below it, it never collects.
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
