/**
 * InboxBatcher's bounds and order (src/storage/inbox-batcher.ts), with statements that record what
 * they were given; the SQL behind the mail path's batches is tested against Postgres in
 * inbox-batches.test.ts.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { type BatchStatements, InboxBatcher } from '../../src/storage/inbox-batcher.ts';

/** Statements answering each item with its text upper-cased, after a turn of the event loop. */
function recording(overrides: Partial<BatchStatements<string, string>> = {}) {
  const sent: string[][] = [];
  const statements: BatchStatements<string, string> = {
    async single(item) {
      sent.push([item]);
      await new Promise((resolve) => setImmediate(resolve));
      return item.toUpperCase();
    },
    async batch(items) {
      sent.push(items);
      await new Promise((resolve) => setImmediate(resolve));
      return items.map((item) => item.toUpperCase());
    },
    ...overrides,
  };
  return { sent, statements };
}

test('one statement per inbox in flight; what waits goes out in arrival order, at most maxBatch at a time', async () => {
  const { sent, statements } = recording();
  const batcher = new InboxBatcher(statements, { maxBatch: 3 });
  const items = ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'];
  const results = await Promise.all([
    ...items.map((item) => batcher.run('inbox-1', item)),
    batcher.run('inbox-2', 'x'),
  ]);

  assert.deepEqual(results, ['A', 'B', 'C', 'D', 'E', 'F', 'G', 'H', 'X']);
  assert.deepEqual(sent, [['a'], ['x'], ['b', 'c', 'd'], ['e', 'f', 'g'], ['h']]);
  assert.deepEqual(batcher.counts, { statements: 5, items: 9 });
});

test('a batch stops before maxBatchBytes, but always carries its first item', async () => {
  const { sent, statements } = recording({ bytes: (item) => item.length });
  const batcher = new InboxBatcher(statements, { maxBatchBytes: 10 });
  await Promise.all(
    ['first', 'aaaa', 'bbbb', 'cccc', 'dddddddddddddddd', 'e'].map((i) => batcher.run('inbox', i)),
  );

  assert.deepEqual(sent, [['first'], ['aaaa', 'bbbb'], ['cccc'], ['dddddddddddddddd'], ['e']]);
});

test('a batch that fails, or answers for the wrong number of items, is run again item by item', async () => {
  let failures = 0;
  const { sent, statements } = recording();
  const failing = new InboxBatcher<string, string>({
    ...statements,
    async batch(items) {
      sent.push(items);
      failures++;
      if (failures === 1) throw new Error('the batch statement failed');
      return ['only one'];
    },
    async single(item) {
      if (item === 'bad') throw new Error('refused');
      return statements.single(item);
    },
  });
  const run = (items: string[]) => Promise.allSettled(items.map((item) => failing.run('inbox', item)));

  const first = await run(['a', 'b', 'bad', 'c']);
  assert.deepEqual(
    first.map((r) => (r.status === 'fulfilled' ? r.value : 'rejected')),
    ['A', 'B', 'rejected', 'C'],
  );
  await new Promise((resolve) => setImmediate(resolve)); // the last single's statement is done
  const second = await run(['d', 'e', 'f']);
  assert.deepEqual(
    second.map((r) => (r.status === 'fulfilled' ? r.value : 'rejected')),
    ['D', 'E', 'F'],
  );
  assert.deepEqual(sent, [['a'], ['b', 'bad', 'c'], ['b'], ['c'], ['d'], ['e', 'f'], ['e'], ['f']]);
});

test("a statement that never returns gives up its inbox's lane after laneTimeoutMs; later work goes on", async () => {
  const { sent, statements } = recording();
  const batcher = new InboxBatcher<string, string>(
    {
      ...statements,
      single: (item) => (item === 'hangs' ? new Promise<string>(() => {}) : statements.single(item)),
    },
    { laneTimeoutMs: 50 },
  );
  let hungSettled = false;
  void batcher.run('inbox', 'hangs').finally(() => {
    hungSettled = true;
  });
  const results = await Promise.all([batcher.run('inbox', 'a'), batcher.run('inbox', 'b')]);

  assert.deepEqual(results, ['A', 'B']);
  // Together: they waited behind the hung statement until its lane was given up.
  assert.deepEqual(sent, [['a', 'b']]);
  assert.equal(hungSettled, false);
});
