/**
 * delivery-streams: the header read, the tee that feeds every recipient's store from one stream, and
 * the store slots (core/delivery-streams.ts). No database: sources and consumers are plain iterables.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { readHead, Slots, StalledError, teeBody } from '../../src/core/delivery-streams.ts';

/** A source that yields `pieces` and counts how many it has handed out. */
function counted(pieces: Buffer[], failAt = -1) {
  const state = { pulled: 0 };
  async function* gen() {
    for (const [i, piece] of pieces.entries()) {
      if (i === failAt) throw new Error('connection lost');
      state.pulled++;
      yield piece;
    }
  }
  return { iterator: gen()[Symbol.asyncIterator](), state };
}

const pieces = (n: number) => Array.from({ length: n }, (_, i) => Buffer.from(`piece ${i};`));

async function collect(branch: AsyncIterable<Buffer>, delayMs = 0): Promise<string> {
  let text = '';
  for await (const piece of branch) {
    text += piece.toString();
    if (delayMs) await new Promise((resolve) => setTimeout(resolve, delayMs));
  }
  return text;
}

test('readHead stops at the blank line, even when it arrives one byte at a time, and keeps the rest', async () => {
  const message = Buffer.from('Subject: x\r\n\r\nbody');
  const { iterator } = counted([...message].map((b) => Buffer.from([b])));
  const head = await readHead(iterator, 1024);
  assert.equal(head.bytes.toString(), 'Subject: x\r\n\r\n');
  assert.equal(head.leftover, null);
  assert.equal(head.done, false);
  assert.equal((await iterator.next()).value?.toString(), 'b');
});

test('readHead stops at maxBytes and returns what did not fit as leftover', async () => {
  const { iterator } = counted([Buffer.from('A: 1234567890\r\n'), Buffer.from('B: abcdefghij\r\n\r\n')]);
  const head = await readHead(iterator, 20);
  assert.equal(head.bytes.toString(), 'A: 1234567890\r\nB: ab');
  assert.equal(head.leftover?.toString(), 'cdefghij\r\n\r\n');
});

test('readHead keeps a first piece that holds the header block as it is, with no copy', async () => {
  const first = Buffer.from('Subject: x\r\n\r\nbody');
  const { iterator } = counted([first, Buffer.from('more')]);
  const head = await readHead(iterator, 256 * 1024);
  assert.equal(head.bytes.toString(), 'Subject: x\r\n\r\nbody');
  assert.equal(head.bytes.buffer, first.buffer, 'the same memory');
  assert.equal(head.bytes.byteOffset, first.byteOffset);
});

test('readHead over many pieces holds about what it read, not maxBytes', async () => {
  const lines = Array.from({ length: 6 }, (_, i) => Buffer.from(`X-${i}: ${'v'.repeat(4990)}\r\n`));
  const { iterator } = counted([...lines, Buffer.from('\r\nbody')]);
  const head = await readHead(iterator, 256 * 1024);
  assert.equal(head.bytes.toString(), `${Buffer.concat(lines).toString()}\r\nbody`);
  const read = head.bytes.length;
  assert.ok(
    head.bytes.buffer.byteLength < 2 * read,
    `${head.bytes.buffer.byteLength} bytes held for ${read}`,
  );
});

test('readHead on a message shorter than its header block reports the end of the source', async () => {
  const { iterator } = counted([Buffer.from('Subject: no body')]);
  const head = await readHead(iterator, 1024);
  assert.deepEqual([head.bytes.toString(), head.done], ['Subject: no body', true]);
});

test('the tee gives every branch every piece in order, pulling at most one piece ahead of the slowest', async () => {
  const all = pieces(50);
  const { iterator, state } = counted(all);
  const head = await readHead(iterator, 4); // 'piec' + leftover 'e 0;'
  const tee = teeBody(head, iterator, 3, 10_000, () => assert.fail('nobody stalls'));
  let slowest = 0;
  let maxAhead = 0;
  const slow = (async () => {
    let text = '';
    for await (const piece of tee.branches[2] as AsyncIterable<Buffer>) {
      text += piece.toString();
      slowest++;
      maxAhead = Math.max(maxAhead, state.pulled - slowest);
      await new Promise((resolve) => setTimeout(resolve, 1));
    }
    return text;
  })();
  const texts = await Promise.all([
    collect(tee.branches[0] as AsyncIterable<Buffer>),
    collect(tee.branches[1] as AsyncIterable<Buffer>),
    slow,
  ]);
  const expected = Buffer.concat(all).toString();
  assert.deepEqual(texts, [expected, expected, expected]);
  assert.ok(maxAhead <= 1, `the source ran ${maxAhead} pieces ahead of the slowest branch`);
  assert.equal(tee.bytes, Buffer.concat(all).length);
});

test('a branch that never reads is cut off after the stall bound; the others finish; its read then throws', async () => {
  const { iterator } = counted(pieces(5));
  const head = await readHead(iterator, 1);
  const stalled: number[] = [];
  const tee = teeBody(head, iterator, 2, 50, (i) => stalled.push(i));
  const text = await collect(tee.branches[0] as AsyncIterable<Buffer>);
  assert.equal(text, Buffer.concat(pieces(5)).toString());
  assert.deepEqual(stalled, [1]);
  await assert.rejects(collect(tee.branches[1] as AsyncIterable<Buffer>), StalledError);
});

test('a branch that stops early (or is detached) does not hold the others back', async () => {
  const { iterator } = counted(pieces(20));
  const tee = teeBody(await readHead(iterator, 1), iterator, 3, 10_000, () => assert.fail('nobody stalls'));
  const quitter = (async () => {
    for await (const _ of tee.branches[0] as AsyncIterable<Buffer>) break;
  })();
  tee.detach(1); // its store failed before reading anything
  const text = await collect(tee.branches[2] as AsyncIterable<Buffer>);
  await quitter;
  assert.equal(text, Buffer.concat(pieces(20)).toString());
});

test('a source error reaches every branch; drain afterwards neither rejects nor hangs', async () => {
  const { iterator } = counted(pieces(10), 4);
  const tee = teeBody(await readHead(iterator, 1), iterator, 2, 10_000, () => {});
  const results = await Promise.allSettled(tee.branches.map((b) => collect(b)));
  assert.deepEqual(
    results.map((r) => r.status === 'rejected' && (r.reason as Error).message),
    ['connection lost', 'connection lost'],
  );
  tee.detach(0);
  tee.detach(1);
  await tee.drain();
});

test('drain reads the rest of the source when every branch has gone', async () => {
  const { iterator, state } = counted(pieces(30));
  const tee = teeBody(await readHead(iterator, 1), iterator, 2, 10_000, () => {});
  tee.detach(0);
  tee.detach(1);
  await tee.drain();
  assert.equal(state.pulled, 30);
  assert.equal((await iterator.next()).done, true);
});

test('slots are taken all at once, first come first served', async () => {
  const slots = new Slots(4);
  await slots.acquire(3);
  const order: string[] = [];
  const two = slots.acquire(2).then(() => order.push('two'));
  const one = slots.acquire(1).then(() => order.push('one')); // fits, but waits its turn
  await new Promise((resolve) => setTimeout(resolve, 10));
  assert.deepEqual(order, []);
  slots.release(3);
  await Promise.all([two, one]);
  assert.deepEqual(order, ['two', 'one']);
  await slots.acquire(0); // nothing to wait for
});
