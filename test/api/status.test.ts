/**
 * status - GET /v1/inboxes/{id} (contract sections 2, 3 and 4): every field of the inbox status, the
 * counts (in-flight deliveries included), the final counts of an expired inbox, and the purge.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { TOKENS } from '../../src/container.ts';
import { newMessageId } from '../../src/core/ids.ts';
import type { InboxService, ProvisionedInbox } from '../../src/core/inbox-service.ts';
import { expectError } from '../support/assertions.ts';
import { type ApiResponse, type Harness, startHarness } from '../support/harness.ts';

const QUOTA = 104857600;

let h: Harness;
before(async () => {
  h = await startHarness();
});
after(() => h.close());

let queueCounter = 0;

function status(inbox: ProvisionedInbox, token = inbox.credentials.reader): Promise<ApiResponse> {
  return h.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token });
}

async function counts(inbox: ProvisionedInbox) {
  const response = await status(inbox);
  assert.equal(response.status, 200, response.text);
  const { state, message_count, quota_used_bytes, rejection_count } = response.json;
  return { state, message_count, quota_used_bytes, rejection_count };
}

async function reserve(inbox: ProvisionedInbox, sizeBytes: number): Promise<void> {
  const result = await h.messages.reserve({
    inboxId: inbox.inbox_id,
    messageId: newMessageId(),
    queueId: `status-q${++queueCounter}`,
    sizeBytes,
    envelopeFrom: 'a@b.c',
    now: h.clock.now(),
  });
  assert.equal(result, 'reserved');
}

const message = (bytes: number): string => {
  const head = 'From: a@example.com\r\nSubject: s\r\n\r\n';
  return head + 'x'.repeat(bytes - head.length);
};

test('status answers 200 with every field of the inbox status, for the owner and the reader', async () => {
  const inbox = await h.provision(['B.example', 'a.example']);
  for (const token of [inbox.credentials.owner, inbox.credentials.reader]) {
    const response = await status(inbox, token);
    assert.equal(response.status, 200, response.text);
    assert.deepEqual(response.json, {
      inbox_id: inbox.inbox_id,
      address: `${inbox.inbox_id}@inbox.test`,
      state: 'live',
      created_at: inbox.created_at,
      expires_at: inbox.expires_at,
      quota_bytes: QUOTA,
      quota_used_bytes: 0,
      message_count: 0,
      rejection_count: 0,
      sender_domains: ['a.example', 'b.example'],
    });
  }
});

test('status counts an in-flight reservation in quota_used_bytes and message_count', async () => {
  const inbox = await h.provision();
  await reserve(inbox, 1234);
  assert.deepEqual(await counts(inbox), {
    state: 'live',
    message_count: 1,
    quota_used_bytes: 1234,
    rejection_count: 0,
  });
  // Poll does not list the delivery in flight, so message_count briefly exceeds what poll lists.
  const poll = await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, { token: inbox.credentials.reader });
  assert.equal(poll.json.messages.length, 0);
  assert.equal(poll.json.inbox.message_count, 1);
});

test('status counts stored messages and in-flight reservations together', async () => {
  const inbox = await h.provision();
  await h.deliver(inbox.inbox_id, message(500));
  await h.deliver(inbox.inbox_id, message(700));
  await reserve(inbox, 1234);
  assert.deepEqual(await counts(inbox), {
    state: 'live',
    message_count: 3,
    quota_used_bytes: 500 + 700 + 1234,
    rejection_count: 0,
  });
});

test('status rejection_count counts every recorded rejection, including ones no longer listed', async () => {
  const inbox = await h.provision();
  const total = h.config.maxRejections + 3;
  for (let i = 0; i < total; i++) {
    await h.reject(inbox.inbox_id, { reason: i % 2 ? 'quota' : 'sender_not_allowed', sizeBytes: 10 });
  }
  const poll = await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages?limit=200`, {
    token: inbox.credentials.reader,
  });
  assert.equal(poll.json.rejections.length, h.config.maxRejections);
  assert.equal((await counts(inbox)).rejection_count, total);
  // Rejected mail never counts against the quota.
  assert.equal((await counts(inbox)).quota_used_bytes, 0);
});

test('status stops counting a downloaded message once its grace window ends', async () => {
  const inbox = await h.provision();
  const id = await h.deliver(inbox.inbox_id, message(400));
  await h.deliver(inbox.inbox_id, message(600));
  const download = await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages/${id}`, {
    token: inbox.credentials.reader,
  });
  assert.equal(download.status, 200, download.text);
  assert.deepEqual(await counts(inbox), {
    state: 'live',
    message_count: 2,
    quota_used_bytes: 1000,
    rejection_count: 0,
  });
  h.clock.advance(h.config.downloadGraceSeconds);
  assert.deepEqual(await counts(inbox), {
    state: 'live',
    message_count: 1,
    quota_used_bytes: 600,
    rejection_count: 0,
  });
});

test('status of an expired inbox reports state expired with its final counts, as of expires_at', async () => {
  const inbox = await h.provision(['final.example']);
  await h.deliver(inbox.inbox_id, message(300));
  await h.deliver(inbox.inbox_id, message(900));
  await reserve(inbox, 1234);
  await h.reject(inbox.inbox_id, { reason: 'quota', sizeBytes: 5 });
  const live = await counts(inbox);
  assert.deepEqual(live, { state: 'live', message_count: 3, quota_used_bytes: 2434, rejection_count: 1 });

  h.clock.advance(3600);
  const atExpiry = await status(inbox);
  assert.equal(atExpiry.status, 200, atExpiry.text);
  assert.equal(atExpiry.json.state, 'expired');
  assert.equal(atExpiry.json.expires_at, inbox.expires_at);
  assert.equal(atExpiry.json.created_at, inbox.created_at);
  assert.equal(atExpiry.json.quota_bytes, QUOTA);
  assert.deepEqual(atExpiry.json.sender_domains, ['final.example']);
  assert.deepEqual(await counts(inbox), { ...live, state: 'expired' });

  h.clock.advance(h.config.purgeAfterSeconds - 1);
  assert.deepEqual(
    await counts(inbox),
    { ...live, state: 'expired' },
    'the counts stay final until the purge',
  );
  const poll = await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, { token: inbox.credentials.owner });
  assert.equal(poll.status, 200, poll.text);
  assert.equal(poll.json.inbox.state, 'expired');
  assert.equal(poll.json.messages.length, 0);
  assert.equal(poll.json.inbox.message_count, live.message_count);
});

test('status of an expired inbox leaves out messages deleted before expires_at', async () => {
  const inbox = await h.provision();
  const id = await h.deliver(inbox.inbox_id, message(400));
  await h.deliver(inbox.inbox_id, message(600));
  await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages/${id}`, { token: inbox.credentials.reader });
  h.clock.advance(h.config.downloadGraceSeconds);
  h.clock.advance(3600 - h.config.downloadGraceSeconds + 10);
  assert.deepEqual(await counts(inbox), {
    state: 'expired',
    message_count: 1,
    quota_used_bytes: 600,
    rejection_count: 0,
  });
});

test('status after the purge answers 401 unauthorized for both credentials', async () => {
  const inbox = await h.provision();
  h.clock.advance(3600 + h.config.purgeAfterSeconds - 1);
  assert.equal((await status(inbox)).json.state, 'expired');
  h.clock.advance(1);
  for (const token of [inbox.credentials.owner, inbox.credentials.reader]) {
    const response = await status(inbox, token);
    expectError(response, 401, 'unauthorized');
    assert.equal(response.json.error.details, undefined);
  }
});

test('status with a credential problem answers 401 unauthorized', async () => {
  const inbox = await h.provision();
  const other = await h.provision();
  for (const token of [
    undefined,
    'xyz',
    `rmr_${'2'.repeat(32)}`,
    other.credentials.owner,
    other.credentials.reader,
  ]) {
    const response = await h.api.get(`/v1/inboxes/${inbox.inbox_id}`, token ? { token } : {});
    expectError(response, 401, 'unauthorized');
  }
  // A valid credential on an id that is not its inbox's, well-formed or not, is the same 401.
  for (const id of ['0'.repeat(20), 'not-an-inbox-id', inbox.inbox_id.toUpperCase()]) {
    expectError(
      await h.api.get(`/v1/inboxes/${id}`, { token: inbox.credentials.owner }),
      401,
      'unauthorized',
    );
  }
});

test('status on a cancelled inbox answers 410 inbox_cancelled with details.reason abuse and details.cancelled_at', async () => {
  const inbox = await h.provision();
  const cancelledAt = h.clock.now();
  await h.container.resolve<InboxService>(TOKENS.InboxService).cancel(inbox.inbox_id);
  h.clock.advance(1);
  for (const token of [inbox.credentials.owner, inbox.credentials.reader]) {
    const details = expectError(await status(inbox, token), 410, 'inbox_cancelled');
    assert.deepEqual(details, { reason: 'abuse', cancelled_at: cancelledAt.toISOString() });
  }
});

test('status with a query parameter answers 400 invalid_request naming it', async () => {
  const inbox = await h.provision();
  const response = await h.api.get(`/v1/inboxes/${inbox.inbox_id}?verbose=1`, {
    token: inbox.credentials.reader,
  });
  assert.equal(expectError(response, 400, 'invalid_request').field, 'verbose');
});

test('status reflects an extend and a new sender_domains list', async () => {
  const inbox = await h.provision();
  await h.api.post(`/v1/inboxes/${inbox.inbox_id}/extend`, { token: inbox.credentials.owner });
  await h.api.put(`/v1/inboxes/${inbox.inbox_id}/sender-domains`, {
    token: inbox.credentials.owner,
    body: { sender_domains: ['Later.example'] },
  });
  const response = await status(inbox);
  assert.equal(Date.parse(response.json.expires_at), Date.parse(inbox.expires_at) + 3600 * 1000);
  assert.deepEqual(response.json.sender_domains, ['later.example']);
});
