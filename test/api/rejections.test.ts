/**
 * Rejection events (contract section 2 "Rejection event", section 3 "Rejection record", section 6):
 * what poll lists, what rejection_count counts, the cap on held records and their retention.
 * MAX_REJECTIONS is 3 here so the cap is cheap to reach.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, test } from 'node:test';
import type { ProvisionedInbox } from '../../src/core/inbox-service.ts';
import { iso } from '../support/assertions.ts';
import { type Harness, startHarness } from '../support/harness.ts';

const MAX = 3;
let h: Harness;
before(async () => {
  h = await startHarness({ MAX_REJECTIONS: String(MAX), POLL_RATE_BURST: '100000' });
});
after(() => h.close());

async function poll(inbox: ProvisionedInbox, query = '') {
  const response = await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages${query}`, {
    token: inbox.credentials.reader,
  });
  assert.equal(response.status, 200, response.text);
  return response.json;
}

async function rejectionCount(inbox: ProvisionedInbox): Promise<number> {
  const response = await h.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.owner });
  assert.equal(response.status, 200);
  return response.json.rejection_count;
}

const senders = (body: { rejections: { envelope_from: string }[] }) =>
  body.rejections.map((r) => r.envelope_from);

async function extend(inbox: ProvisionedInbox): Promise<void> {
  const response = await h.api.post(`/v1/inboxes/${inbox.inbox_id}/extend`, {
    token: inbox.credentials.owner,
  });
  assert.equal(response.status, 200);
}

test('a rejection is listed with at, envelope_from, reason, sender_domain and size_bytes for every reason', async () => {
  const inbox = await h.provision();
  const quotaAt = iso(h.clock.now());
  await h.reject(inbox.inbox_id, {
    reason: 'quota',
    envelopeFrom: 'big@files.example',
    senderDomain: 'files.example',
    sizeBytes: 26_000_000,
  });
  h.clock.advance(1);
  const notAllowedAt = iso(h.clock.now());
  await h.reject(inbox.inbox_id, {
    reason: 'sender_not_allowed',
    envelopeFrom: 'news@shop.example',
    senderDomain: null,
    sizeBytes: 4321,
    internetMessageId: '<n1@shop.example>',
  });
  h.clock.advance(1);
  const optedOutAt = iso(h.clock.now());
  await h.reject(inbox.inbox_id, {
    reason: 'sender_opted_out',
    envelopeFrom: 'no-reply@bank.example',
    senderDomain: 'bank.example',
    sizeBytes: 0,
  });
  const body = await poll(inbox);
  assert.deepEqual(body.rejections, [
    {
      at: quotaAt,
      envelope_from: 'big@files.example',
      reason: 'quota',
      sender_domain: 'files.example',
      size_bytes: 26_000_000,
    },
    {
      at: notAllowedAt,
      envelope_from: 'news@shop.example',
      reason: 'sender_not_allowed',
      sender_domain: null,
      size_bytes: 4321,
    },
    {
      at: optedOutAt,
      envelope_from: 'no-reply@bank.example',
      reason: 'sender_opted_out',
      sender_domain: 'bank.example',
      size_bytes: 0,
    },
  ]);
  assert.equal(body.inbox.rejection_count, 3);
});

test('rejection_count counts every recorded rejection attempt', async () => {
  const inbox = await h.provision();
  assert.equal(await rejectionCount(inbox), 0);
  await h.reject(inbox.inbox_id, { envelopeFrom: 'a@example.net' });
  assert.equal(await rejectionCount(inbox), 1);
  await h.reject(inbox.inbox_id, { envelopeFrom: 'b@example.net', reason: 'sender_opted_out' });
  assert.equal(await rejectionCount(inbox), 2);
});

test('retries of one sender_not_allowed message are one event, but every attempt counts', async () => {
  const inbox = await h.provision(['allowed.example']);
  const attempt = () =>
    h.reject(inbox.inbox_id, {
      reason: 'sender_not_allowed',
      envelopeFrom: 'list@other.example',
      senderDomain: 'other.example',
      sizeBytes: 900,
      internetMessageId: '<retry-1@other.example>',
    });
  const firstAt = iso(h.clock.now());
  assert.equal(await attempt(), 'recorded');
  h.clock.advance(300);
  assert.equal(await attempt(), 'counted');
  const first = await poll(inbox);
  assert.deepEqual(first.rejections, [
    {
      at: firstAt,
      envelope_from: 'list@other.example',
      reason: 'sender_not_allowed',
      sender_domain: 'other.example',
      size_bytes: 900,
    },
  ]);
  assert.equal(first.inbox.rejection_count, 2);

  // A retry after the poller has seen the event is not a new event either.
  h.clock.advance(600);
  assert.equal(await attempt(), 'counted');
  const next = await poll(inbox, `?cursor=${first.next_cursor}`);
  assert.deepEqual(next.rejections, []);
  assert.equal(next.inbox.rejection_count, 3);

  // The same message authenticated as another domain (a retry after a DNS failure left the first
  // unauthenticated, say) is another event: the agent learns the domain to add.
  await h.reject(inbox.inbox_id, {
    reason: 'sender_not_allowed',
    envelopeFrom: 'list@other.example',
    senderDomain: null,
    sizeBytes: 900,
    internetMessageId: '<retry-1@other.example>',
  });
  const unauthenticated = await poll(inbox, `?cursor=${next.next_cursor}`);
  assert.deepEqual(
    unauthenticated.rejections.map((r: { sender_domain: string | null }) => r.sender_domain),
    [null],
  );
  assert.equal(await attempt(), 'counted');

  // Another message from the same sender is another event.
  await h.reject(inbox.inbox_id, {
    reason: 'sender_not_allowed',
    envelopeFrom: 'list@other.example',
    senderDomain: 'other.example',
    sizeBytes: 901,
    internetMessageId: '<retry-2@other.example>',
  });
  const third = await poll(inbox, `?cursor=${unauthenticated.next_cursor}`);
  assert.deepEqual(
    third.rejections.map((r: { size_bytes: number }) => r.size_bytes),
    [901],
  );
  assert.equal(third.inbox.rejection_count, 6);
});

test('a Message-ID of any length is recorded and compared (no index entry size limit): 16 KB of random text', async () => {
  const inbox = await h.provision(['allowed.example']);
  const huge = `<${randomBytes(12_000).toString('base64')}@other.example>`;
  for (const reason of ['quota', 'sender_opted_out'] as const) {
    assert.equal(await h.reject(inbox.inbox_id, { reason, internetMessageId: huge }), 'recorded', reason);
  }
  const retry = () =>
    h.reject(inbox.inbox_id, { reason: 'sender_not_allowed', senderDomain: null, internetMessageId: huge });
  assert.equal(await retry(), 'recorded');
  assert.equal(await retry(), 'counted', 'the retry is recognized by its Message-ID');
  assert.equal(await rejectionCount(inbox), 4);
});

test('sender_not_allowed rejections without a Message-ID are separate events', async () => {
  const inbox = await h.provision(['allowed.example']);
  for (let i = 0; i < 2; i++) {
    const outcome = await h.reject(inbox.inbox_id, {
      reason: 'sender_not_allowed',
      envelopeFrom: `anon${i}@other.example`,
      internetMessageId: null,
    });
    assert.equal(outcome, 'recorded');
  }
  assert.deepEqual(senders(await poll(inbox)), ['anon0@other.example', 'anon1@other.example']);
});

test('at most MAX_REJECTIONS are held: the oldest are kept and later ones are only counted', async () => {
  const inbox = await h.provision();
  const outcomes: string[] = [];
  for (let i = 0; i < MAX + 2; i++) {
    outcomes.push(await h.reject(inbox.inbox_id, { envelopeFrom: `r${i}@example.net` }));
    h.clock.advance(1);
  }
  assert.deepEqual(outcomes, ['recorded', 'recorded', 'recorded', 'counted', 'counted']);
  const body = await poll(inbox);
  assert.deepEqual(senders(body), ['r0@example.net', 'r1@example.net', 'r2@example.net']);
  assert.equal(body.inbox.rejection_count, MAX + 2);
  // Nothing over the cap shows up later behind the cursor either.
  const next = await poll(inbox, `?cursor=${body.next_cursor}`);
  assert.deepEqual(next.rejections, []);
});

test('a rejection is deleted REJECTION_RETENTION_SECONDS after poll first lists it', async () => {
  const inbox = await h.provision();
  await extend(inbox);
  await h.reject(inbox.inbox_id, { envelopeFrom: 'early@example.net' });
  // Not yet listed: no timer runs.
  h.clock.advance(1000);
  const first = await poll(inbox);
  assert.deepEqual(senders(first), ['early@example.net']);
  h.clock.advance(500);
  await h.reject(inbox.inbox_id, { envelopeFrom: 'late@example.net' });

  h.clock.advance(h.config.rejectionRetentionSeconds - 500 - 1);
  // The second one was first listed by this poll, so its timer starts now.
  assert.deepEqual(senders(await poll(inbox)), ['early@example.net', 'late@example.net']);
  h.clock.advance(1);
  const after = await poll(inbox);
  assert.deepEqual(senders(after), ['late@example.net']);
  assert.equal(after.inbox.rejection_count, 2, 'the count keeps deleted rejections');
  // late was first listed one second before the previous poll.
  h.clock.advance(h.config.rejectionRetentionSeconds - 2);
  assert.deepEqual(senders(await poll(inbox)), ['late@example.net']);
  h.clock.advance(1);
  assert.deepEqual(senders(await poll(inbox)), []);
});

test('a held slot frees up once a listed rejection is deleted', async () => {
  const inbox = await h.provision();
  await extend(inbox);
  for (let i = 0; i < MAX; i++) await h.reject(inbox.inbox_id, { envelopeFrom: `old${i}@example.net` });
  await poll(inbox);
  assert.equal(await h.reject(inbox.inbox_id, { envelopeFrom: 'overflow@example.net' }), 'counted');
  h.clock.advance(h.config.rejectionRetentionSeconds);
  assert.equal(await h.reject(inbox.inbox_id, { envelopeFrom: 'fresh@example.net' }), 'recorded');
  const body = await poll(inbox);
  assert.deepEqual(senders(body), ['fresh@example.net']);
  assert.equal(body.inbox.rejection_count, MAX + 2);
});

test('a sender_not_allowed retry after its event was deleted is recorded as a new event', async () => {
  const inbox = await h.provision(['allowed.example']);
  await extend(inbox);
  const attempt = () =>
    h.reject(inbox.inbox_id, {
      reason: 'sender_not_allowed',
      envelopeFrom: 'slow@other.example',
      internetMessageId: '<slow@other.example>',
    });
  assert.equal(await attempt(), 'recorded');
  const first = await poll(inbox);
  h.clock.advance(h.config.rejectionRetentionSeconds);
  assert.equal(await attempt(), 'recorded');
  const next = await poll(inbox, `?cursor=${first.next_cursor}`);
  assert.deepEqual(senders(next), ['slow@other.example']);
});

test('an expired inbox keeps listing its rejections until an hour after poll first listed them', async () => {
  const inbox = await h.provision();
  h.clock.advance(h.config.unitSeconds - 100);
  await h.reject(inbox.inbox_id, { envelopeFrom: 'before-expiry@example.net' });
  const listedAt = Date.parse((await poll(inbox)).server_time);
  h.clock.advance(200);
  const expired = await poll(inbox);
  assert.equal(expired.inbox.state, 'expired');
  assert.deepEqual(senders(expired), ['before-expiry@example.net']);
  assert.equal(expired.inbox.rejection_count, 1);
  // The inbox is purged PURGE_AFTER_SECONDS after expiry; the record goes with it at the latest.
  const end = Math.min(
    listedAt + h.config.rejectionRetentionSeconds * 1000,
    Date.parse(inbox.expires_at) + h.config.purgeAfterSeconds * 1000,
  );
  h.clock.advance((end - h.clock.now().getTime()) / 1000 - 1);
  assert.deepEqual(senders(await poll(inbox)), ['before-expiry@example.net']);
});
