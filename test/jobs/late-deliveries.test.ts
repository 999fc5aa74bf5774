/**
 * Deliveries that reach the store late, against the jobs (contract section 3: an expired inbox's
 * status "keeps final counts"; DESIGN decision 9: time rules are evaluated on read, jobs only clean
 * up). Whatever the order of a late store and a job, the answers are the same:
 * - a message reserved before expiry and delivered more than a minute after it (the expiry sweep's
 *   margin) leaves the final counts as they were at expires_at, whether the sweep ran first or not
 *   (migrations/20261202000000_expired_delivery.ts); within the minute it is stored, since a receiver
 *   whose clock runs ahead may see expired an inbox the API still extends;
 * - a delivery after its reservation was released is dropped, also once GONE_SECONDS have passed
 *   (drop-tombstones keeps released rows);
 * - a redelivery of a stored, downloaded and deleted message is a duplicate until Postfix has given up
 *   on its queue file (drop-tombstones keeps every row until RESERVATION_TTL_SECONDS);
 * - an expired inbox whose only message has 0 bytes is purged like any other.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, describe, test } from 'node:test';
import { newMessageId } from '../../src/core/ids.ts';
import type { ProvisionedInbox } from '../../src/core/inbox-service.ts';
import { EXPIRE_SETTLE_SECONDS } from '../../src/jobs/expire-inboxes.ts';
import { CHUNK_BYTES } from '../../src/storage/message-store.ts';
import { type Harness, startHarness } from '../support/harness.ts';
import { footprint, testJobs } from '../support/jobs.ts';

const SUMMARY = {
  fromName: null,
  fromAddress: null,
  subject: 'late',
  internetMessageId: null,
  authentication: null,
};
/** What the milter reserves beyond the message (our field, Postfix's Received): more than it adds here. */
const ALLOWANCE = 1_500;

function withHarness(env: Record<string, string>): () => Harness {
  let h: Harness;
  before(async () => {
    h = await startHarness({ POLL_RATE_BURST: '100000', ...env });
  });
  after(() => h.close());
  return () => h;
}

async function status(h: Harness, inbox: ProvisionedInbox) {
  const response = await h.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.reader });
  assert.equal(response.status, 200, response.text);
  return response.json;
}

const reserve = (h: Harness, inbox: ProvisionedInbox, queueId: string, bytes: number) =>
  h.messages.reserve({
    inboxId: inbox.inbox_id,
    messageId: newMessageId(),
    queueId,
    sizeBytes: bytes + ALLOWANCE,
    envelopeFrom: 's@example.test',
    now: h.clock.now(),
  });

async function* pieces(data: Buffer): AsyncIterable<Buffer> {
  for (let at = 0; at < data.length; at += 65_536) yield data.subarray(at, at + 65_536);
}

const store = (h: Harness, inbox: ProvisionedInbox, queueId: string, data: Buffer) =>
  h.messages.store(
    {
      inboxId: inbox.inbox_id,
      queueId,
      envelopeFrom: 's@example.test',
      now: h.clock.now(),
      summary: SUMMARY,
    },
    pieces(data),
  );

describe('a message reserved before expiry and delivered after it', () => {
  const harness = withHarness({});

  for (const [kind, size] of [
    ['whole', 5_000],
    ['streamed', 2 * CHUNK_BYTES + 1],
  ] as const) {
    test(`${kind}: the final counts are those at expires_at, whether the store or the expiry sweep comes first`, async () => {
      const h = harness();
      const storeFirst = await h.provision();
      const sweepFirst = await h.provision();
      const data = randomBytes(size);
      assert.equal(await reserve(h, storeFirst, `QS${kind}`, size), 'reserved');
      assert.equal(await reserve(h, sweepFirst, `QW${kind}`, size), 'reserved');
      // Past the expiry sweep's margin: from here on either may come first.
      h.clock.advance(h.config.unitSeconds + EXPIRE_SETTLE_SECONDS + 1);
      const atExpiry = await status(h, storeFirst);
      assert.equal(atExpiry.state, 'expired');
      assert.equal(atExpiry.quota_used_bytes, size + ALLOWANCE);
      assert.equal(atExpiry.message_count, 1);
      assert.deepEqual(await status(h, sweepFirst), {
        ...atExpiry,
        inbox_id: sweepFirst.inbox_id,
        address: sweepFirst.address,
      });

      // The store lands before the expiry sweep: the receiver answers 250 saying it expired; nothing kept.
      assert.equal((await store(h, storeFirst, `QS${kind}`, data)).kind, 'expired');
      assert.deepEqual(await status(h, storeFirst), atExpiry);
      assert.equal((await footprint(h, storeFirst.inbox_id)).chunks, 0);

      await testJobs(h).run('expire-inboxes');
      // The sweep came first for the other inbox: its late store keeps nothing and says it expired
      // (it said `duplicate`, "already stored", until 2026-11-25).
      assert.equal((await store(h, sweepFirst, `QW${kind}`, data)).kind, 'expired');

      for (const inbox of [storeFirst, sweepFirst]) {
        const final = await status(h, inbox);
        assert.equal(final.quota_used_bytes, atExpiry.quota_used_bytes);
        assert.equal(final.message_count, atExpiry.message_count);
        const left = await footprint(h, inbox.inbox_id);
        assert.deepEqual([left.undeleted, left.chunks], [0, 0]);
      }
    });
  }
});

describe('a receiver whose clock runs ahead of the API', () => {
  const harness = withHarness({});

  test('stores a message it dates within a minute past expires_at, and an extend the API still takes keeps it', async () => {
    const h = harness();
    const inbox = await h.provision();
    assert.equal(await reserve(h, inbox, 'QSKEW', 100), 'reserved');
    h.clock.advance(h.config.unitSeconds - 1);
    const data = Buffer.from('Subject: skew\r\n\r\nbody\r\n');
    // The receiver's clock is 2 s ahead: to it, the inbox expired a second ago.
    const late = await h.messages.store(
      {
        inboxId: inbox.inbox_id,
        queueId: 'QSKEW',
        envelopeFrom: 's@example.test',
        now: new Date(h.clock.now().getTime() + 2_000),
        summary: SUMMARY,
      },
      pieces(data),
    );
    assert.equal(late.kind, 'stored');
    const extended = await h.api.post(`/v1/inboxes/${inbox.inbox_id}/extend`, {
      token: inbox.credentials.owner,
    });
    assert.equal(extended.status, 200, extended.text);
    const listed = await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, {
      token: inbox.credentials.reader,
    });
    assert.deepEqual(
      listed.json.messages.map((m: { subject: string; size_bytes: number }) => [m.subject, m.size_bytes]),
      [['late', data.length]],
    );
    assert.equal((await status(h, inbox)).quota_used_bytes, data.length);
  });
});

describe('a delivery after its reservation was released', () => {
  const harness = withHarness({ QUOTA_BYTES: '10000', RESERVATION_TTL_SECONDS: '600', GONE_SECONDS: '600' });

  test('is dropped (answered as released, nothing stored), also after drop-tombstones has run', async () => {
    const h = harness();
    const inbox = await h.provision();
    const jobs = testJobs(h);
    assert.equal(await reserve(h, inbox, 'QLATE', 7_000), 'reserved');
    h.clock.advance(601);
    await jobs.run('release-reservations');
    // The freed quota goes to other mail.
    await h.deliver(inbox.inbox_id, Buffer.alloc(9_000, 'y'));
    h.clock.advance(601);
    await jobs.run('drop-tombstones');

    const late = await store(h, inbox, 'QLATE', Buffer.alloc(7_000, 'x'));
    assert.equal(late.kind, 'released');
    const after = await status(h, inbox);
    assert.equal(after.message_count, 1);
    assert.equal(after.quota_used_bytes, 9_000);
  });
});

describe('a redelivery of a stored message whose 250 was lost', () => {
  const harness = withHarness({ QUOTA_BYTES: '10000', RESERVATION_TTL_SECONDS: '7200' });

  test('is a duplicate after the message was deleted and GONE_SECONDS passed, until Postfix gave up', async () => {
    const h = harness();
    const inbox = await h.provision();
    for (let i = 0; i < 3; i++)
      await h.api.post(`/v1/inboxes/${inbox.inbox_id}/extend`, { token: inbox.credentials.owner });
    const jobs = testJobs(h);
    const data = Buffer.alloc(6_000, 'x');
    assert.equal(await reserve(h, inbox, 'QAGAIN', data.length), 'reserved');
    assert.equal((await store(h, inbox, 'QAGAIN', data)).kind, 'stored');
    const [message] = (
      await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, { token: inbox.credentials.reader })
    ).json.messages;
    const url = `/v1/inboxes/${inbox.inbox_id}/messages/${message.message_id}`;
    assert.equal((await h.api.get(url, { token: inbox.credentials.reader })).status, 200);
    h.clock.advance(h.config.downloadGraceSeconds);
    await jobs.run('delete-messages');
    h.clock.advance(h.config.goneSeconds);
    assert.equal((await h.api.get(url, { token: inbox.credentials.reader })).status, 404);
    assert.equal((await jobs.run('drop-tombstones')).counts.messages, 0, 'Postfix may still redeliver it');

    // The receiver died after its commit; Postfix delivers the queue file again an hour later.
    assert.equal((await store(h, inbox, 'QAGAIN', data)).kind, 'duplicate');
    const after = await status(h, inbox);
    assert.deepEqual([after.message_count, after.quota_used_bytes], [0, 0]);

    h.clock.advance(7_200 - h.config.downloadGraceSeconds - h.config.goneSeconds);
    assert.equal((await jobs.run('drop-tombstones')).counts.messages, 1, 'past RESERVATION_TTL_SECONDS');
  });
});

describe('an expired inbox holding a message of 0 bytes', () => {
  const harness = withHarness({});

  test('is purged like any other', async () => {
    const h = harness();
    const inbox = await h.provision();
    await h.deliver(inbox.inbox_id, '');
    h.clock.advance(h.config.unitSeconds + h.config.purgeAfterSeconds + EXPIRE_SETTLE_SECONDS + 1);
    const jobs = testJobs(h);
    await jobs.sweep();
    await jobs.sweep();
    const left = await footprint(h, inbox.inbox_id);
    assert.deepEqual([left.inboxes, left.credentials, left.messages], [0, 0, 0]);
  });
});
