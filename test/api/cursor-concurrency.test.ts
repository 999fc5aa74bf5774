/**
 * The poll cursor never skips (DESIGN decision 8; contract section 4 poll rules 4 and 5): while several
 * writers on separate pool connections deliver messages and record rejections on one inbox, a poller
 * following next_url sees every event exactly once. Some deliveries stream their body slowly, so their
 * transactions are still open while later ones commit.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { newMessageId } from '../../src/core/ids.ts';
import type { ProvisionedInbox } from '../../src/core/inbox-service.ts';
import { type Harness, startHarness } from '../support/harness.ts';

const WRITERS = 4;
const EVENTS_PER_WRITER = 75;
const LIMIT = 7;

let h: Harness;
before(async () => {
  h = await startHarness({ POLL_RATE_BURST: '1000000', MAX_REJECTIONS: '100000' });
});
after(() => h.close());

/** A delivery whose body arrives in pieces with pauses, keeping its store transaction open a while. */
async function slowDeliver(inboxId: string, tag: string): Promise<string> {
  const queueId = `SLOW${tag}`;
  const raw = Buffer.from(`Subject: ${tag}\r\n\r\n${'y'.repeat(3000)}\r\n`);
  const reserved = await h.messages.reserve({
    inboxId,
    messageId: newMessageId(),
    queueId,
    sizeBytes: raw.length,
    envelopeFrom: `${tag}@slow.example`,
    now: h.clock.now(),
  });
  assert.equal(reserved, 'reserved');
  async function* body() {
    for (let i = 0; i < raw.length; i += 1000) {
      await sleep(2);
      yield raw.subarray(i, i + 1000);
    }
  }
  const stored = await h.messages.store(
    {
      inboxId,
      queueId,
      envelopeFrom: `${tag}@slow.example`,
      now: h.clock.now(),
      summary: {
        fromName: null,
        fromAddress: null,
        subject: tag,
        internetMessageId: null,
        authentication: null,
      },
    },
    body(),
  );
  assert.equal(stored.kind, 'stored');
  return stored.messageId;
}

async function writer(inbox: ProvisionedInbox, w: number, created: Set<string>): Promise<void> {
  for (let i = 0; i < EVENTS_PER_WRITER; i++) {
    const tag = `w${w}e${i}`;
    switch ((i + w) % 4) {
      case 0:
        created.add(await slowDeliver(inbox.inbox_id, tag));
        break;
      case 1:
        created.add(await h.deliver(inbox.inbox_id, `Subject: ${tag}\r\n\r\n${tag}\r\n`));
        break;
      default: {
        const envelopeFrom = `${tag}@rejected.example`;
        const outcome = await h.reject(inbox.inbox_id, {
          envelopeFrom,
          reason: i % 3 === 0 ? 'sender_opted_out' : 'quota',
        });
        assert.equal(outcome, 'recorded');
        created.add(envelopeFrom);
      }
    }
    if (i % 5 === 0) await sleep(Math.random() * 3);
  }
}

interface Page {
  ids: string[];
  hasMore: boolean;
  nextUrl: string;
}

async function page(inbox: ProvisionedInbox, url: string): Promise<Page> {
  const response = await h.api.get(url, { token: inbox.credentials.reader });
  assert.equal(response.status, 200, response.text);
  const body = response.json;
  assert.ok(body.messages.length + body.rejections.length <= LIMIT);
  return {
    ids: [
      ...body.messages.map((m: { message_id: string }) => m.message_id),
      ...body.rejections.map((r: { envelope_from: string }) => r.envelope_from),
    ],
    hasMore: body.has_more,
    nextUrl: body.next_url,
  };
}

test('a poller following next_url while four writers add 300 events sees every event exactly once', async () => {
  const inbox = await h.provision();
  const created = new Set<string>();
  let writing = true;
  const writers = Promise.all(Array.from({ length: WRITERS }, (_, w) => writer(inbox, w, created))).finally(
    () => {
      writing = false;
    },
  );

  const seen: string[] = [];
  let url = `/v1/inboxes/${inbox.inbox_id}/messages?limit=${LIMIT}`;
  let pollsWhileWriting = 0;
  let eventsWhileWriting = 0;
  for (;;) {
    const startedAfterWriters = !writing;
    const result = await page(inbox, url);
    if (!startedAfterWriters) {
      pollsWhileWriting++;
      eventsWhileWriting += result.ids.length;
    }
    seen.push(...result.ids);
    url = result.nextUrl;
    if (startedAfterWriters && !result.hasMore) break;
    if (!result.hasMore) await sleep(1);
  }
  await writers;

  assert.equal(created.size, WRITERS * EVENTS_PER_WRITER);
  const duplicates = seen.filter((id, i) => seen.indexOf(id) !== i);
  assert.deepEqual(duplicates, [], 'events seen more than once');
  const missing = [...created].filter((id) => !seen.includes(id));
  assert.deepEqual(missing, [], 'events never seen');
  assert.equal(seen.length, created.size);
  // The test only proves something if the poller really raced the writers.
  assert.ok(pollsWhileWriting > 10, `only ${pollsWhileWriting} polls overlapped the writers`);
  assert.ok(eventsWhileWriting > 0, 'no event was seen while the writers were running');

  // Starting over without a cursor pages through the same events, each once.
  const again: string[] = [];
  let next = `/v1/inboxes/${inbox.inbox_id}/messages?limit=${LIMIT}`;
  for (;;) {
    const result = await page(inbox, next);
    again.push(...result.ids);
    next = result.nextUrl;
    if (!result.hasMore) break;
  }
  assert.equal(again.length, created.size);
  assert.deepEqual(new Set(again), created);
});
