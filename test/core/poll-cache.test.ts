/**
 * core/poll-cache.ts keeps its memory bounded by bytes, not only by pages: a sender can fill an inbox
 * with summaries of some 16,000 characters each, and polls with distinct cursors and limits each made
 * a page of 200 such summaries; 2,000 of them ran the API out of heap (a security review: 4 GB, then
 * "JavaScript heap out of memory").
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { type CachedPage, PollCache, pageBytes } from '../../src/core/poll-cache.ts';
import type { MessageSummary } from '../../src/core/poll-service.ts';

const FAR = Date.now() + 3_600_000;
const now = new Date();

function page(count: number, chars: number, tag: string): CachedPage {
  const text = (c: string) => c.repeat(chars);
  const messages = Array.from(
    { length: count },
    (_, i) =>
      ({
        message_id: `msg_${tag}${i}`,
        url: `http://127.0.0.1/v1/inboxes/x/messages/msg_${tag}${i}`,
        from: { name: text('é'), address: text('a') },
        envelope_from: 's@example.test',
        subject: text('ж'),
        size_bytes: 35_000,
        received_at: now.toISOString(),
        downloaded_at: null,
        delete_after: now.toISOString(),
        internet_message_id: text('m'),
        authentication: null,
      }) as unknown as MessageSummary,
  );
  return {
    version: 1,
    validUntil: FAR,
    messages,
    rejections: [],
    rejectionPositions: [],
    nextPosition: 1,
    hasMore: false,
  };
}

test('pageBytes counts every character of a page at least twice over what its JSON holds', () => {
  const p = page(20, 1_000, 'a');
  const json = JSON.stringify(p.messages).length;
  assert.ok(pageBytes(p) >= 2 * json, `${pageBytes(p)} for ${json} characters of JSON`);
});

test('the kept pages never hold more than the byte budget; the oldest go first', () => {
  const budget = 4 * 1024 * 1024;
  const cache = new PollCache(2_000, budget);
  const one = pageBytes(page(20, 500, 'x'));
  assert.ok(one < budget / 16, 'a page this size is kept');
  for (let i = 0; i < 200; i++) {
    cache.set(PollCache.key('inbox', i, 20), page(20, 500, String(i)));
    assert.ok(cache.bytes <= budget, `after page ${i}: ${cache.bytes}`);
  }
  assert.equal(cache.size, Math.floor(budget / one));
  assert.ok(cache.get(PollCache.key('inbox', 199, 20), 1, now), 'the newest page is kept');
  assert.equal(cache.get(PollCache.key('inbox', 0, 20), 1, now), undefined, 'the oldest went');
});

test('a page larger than a sixteenth of the budget is not kept, and setting a key again counts it once', () => {
  const cache = new PollCache(2_000, 64 * 1024 * 1024);
  const huge = page(200, 4_096, 'h');
  assert.ok(pageBytes(huge) > (64 * 1024 * 1024) / 16);
  cache.set(PollCache.key('inbox', 0, 200), huge);
  assert.equal(cache.get(PollCache.key('inbox', 0, 200), 1, now), undefined);
  assert.equal(cache.bytes, 0);
  assert.equal(Object.isFrozen(huge.messages), false, 'not shared, so not frozen for poll-body');

  const small = page(20, 100, 's');
  cache.set('k', small);
  cache.set('k', page(20, 100, 't'));
  assert.equal(cache.size, 1);
  assert.equal(cache.bytes, pageBytes(small));
});
