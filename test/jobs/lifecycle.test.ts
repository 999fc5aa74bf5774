/**
 * The whole lifecycle of contract section 3 end to end, through the real stack (Postfix, the policy
 * daemon, the milter, the LMTP receiver, the API) with second-scale durations: the fake clock moves and
 * the jobs run after each step, as a sweep would within one interval. Each step checks what the agent
 * and the sender see, and that the jobs removed the rows and the content.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import type { ProvisionedInbox } from '../../src/core/inbox-service.ts';
import { EXPIRE_SETTLE_SECONDS } from '../../src/jobs/expire-inboxes.ts';
import { footprint, scalar, testJobs } from '../support/jobs.ts';
import { type MailStack, plainMessage, startMailStack } from '../support/mail-stack.ts';

let s: MailStack;
before(async () => {
  s = await startMailStack({
    env: {
      UNIT_SECONDS: '60',
      DOWNLOAD_GRACE_SECONDS: '5',
      UNCLAIMED_SECONDS: '10',
      GONE_SECONDS: '10',
      // Above EXPIRE_SETTLE_SECONDS, so the expired inbox is seen with its storage freed before the purge.
      PURGE_AFTER_SECONDS: '90',
      REJECTION_RETENTION_SECONDS: '10',
      IDEMPOTENCY_TTL_SECONDS: '30',
      POLL_RATE_BURST: '100000',
      DOWNLOAD_RATE_BURST: '100000',
    },
  });
});
after(() => s?.close());

/** The sweep a scheduled run would make now; every job runs to completion. */
async function sweep(): Promise<void> {
  for (const report of await testJobs(s).sweep()) {
    assert.equal(report.complete, true, JSON.stringify(report));
  }
}

const atRcpt = (address: string, text: string) =>
  `555 5.7.1 <${address}>: Recipient address rejected: svc.test: ${text}`;

async function send(inbox: ProvisionedInbox, subject: string) {
  return s.send({ to: [inbox.address], message: plainMessage({ to: inbox.address, subject }) });
}

async function pollUntil(inbox: ProvisionedInbox, count: number) {
  return s.waitFor(`${count} messages listed`, async () => {
    const r = await s.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, { token: inbox.credentials.owner });
    return r.json.messages.length >= count ? r.json : undefined;
  });
}

const get = (inbox: ProvisionedInbox, path = '') =>
  s.api.get(`/v1/inboxes/${inbox.inbox_id}${path}`, { token: inbox.credentials.owner });

test('provision, mail, poll, download, 410 downloaded or unclaimed, 404; expiry, purge; the provision key forgotten', async () => {
  const provisioned = await s.api.post('/v1/inboxes', {
    body: {},
    headers: { 'idempotency-key': 'e2e-key-1' },
  });
  assert.equal(provisioned.status, 201);
  const inbox = provisioned.json as ProvisionedInbox;

  // Mail -> poll -> download.
  for (const subject of ['fetched', 'ignored']) {
    assert.match((await send(inbox, subject)).end?.text ?? '', /^250 2\.0\.0 Ok: queued as/);
  }
  const listed = await pollUntil(inbox, 2);
  const id = (subject: string) =>
    listed.messages.find((m: { subject: string }) => m.subject === subject).message_id;
  const [fetched, ignored] = [id('fetched'), id('ignored')];
  assert.equal((await get(inbox, `/messages/${fetched}`)).status, 200);

  // DOWNLOAD_GRACE_SECONDS after the download: 410 downloaded, the content gone.
  s.clock.advance(5);
  await sweep();
  const downloaded = await get(inbox, `/messages/${fetched}`);
  assert.equal(downloaded.status, 410);
  assert.deepEqual(downloaded.json.error.details, { reason: 'downloaded' });
  assert.equal(
    (await get(inbox, `/messages/${ignored}`)).status,
    200,
    'HEAD-free check: GET starts its timer',
  );

  // UNCLAIMED_SECONDS after the listing (the GET above moved `ignored` to the download timer instead).
  const other = await s.api.post('/v1/inboxes', { body: {} });
  const second = other.json as ProvisionedInbox;
  await send(second, 'never fetched');
  const secondListed = await pollUntil(second, 1);
  s.clock.advance(10);
  await sweep();
  const unclaimed = await get(second, `/messages/${secondListed.messages[0].message_id}`);
  assert.equal(unclaimed.status, 410);
  assert.deepEqual(unclaimed.json.error.details, { reason: 'unclaimed' });
  assert.equal((await footprint(s, second.inbox_id)).chunks, 0);

  // GONE_SECONDS after deletion: 404. The rows stay until Postfix has given up on their queue files
  // (RESERVATION_TTL_SECONDS): a redelivery whose first 250 was lost finds them.
  s.clock.advance(10);
  await sweep();
  for (const gone of [fetched, ignored]) assert.equal((await get(inbox, `/messages/${gone}`)).status, 404);
  const tombstones = await footprint(s, inbox.inbox_id);
  assert.deepEqual([tombstones.messages, tombstones.undeleted, tombstones.chunks], [2, 0, 0]);

  // Expiry: a message held at expires_at is counted in the final counts, never listed, its content freed.
  assert.match((await send(inbox, 'held at expiry')).end?.text ?? '', /^250 /);
  await s.waitFor('the message stored', async () =>
    (await footprint(s, inbox.inbox_id)).chunks === 1 ? true : undefined,
  );
  const held = (await get(inbox)).json;
  assert.equal(held.message_count, 1);
  s.clock.advance(
    (Date.parse(inbox.expires_at) - s.clock.now().getTime()) / 1000 + EXPIRE_SETTLE_SECONDS + 1,
  );
  await sweep();
  const expiredPoll = (await get(inbox, '/messages')).json;
  assert.equal(expiredPoll.inbox.state, 'expired');
  assert.deepEqual(expiredPoll.messages, []);
  assert.equal(expiredPoll.inbox.message_count, 1);
  assert.equal(expiredPoll.inbox.quota_used_bytes, held.quota_used_bytes);
  assert.equal((await footprint(s, inbox.inbox_id)).chunks, 0, 'storage returns to zero');
  const refused = await send(inbox, 'too late');
  assert.deepEqual(
    refused.rcpt.map((r) => r.text),
    [atRcpt(inbox.address, 'inbox expired')],
  );

  // PURGE_AFTER_SECONDS after expiry: 401 and no such inbox; nothing of it is left.
  s.clock.advance(90 - EXPIRE_SETTLE_SECONDS - 1);
  await sweep();
  assert.equal((await get(inbox)).status, 401);
  const unknown = await send(inbox, 'after the purge');
  assert.deepEqual(
    unknown.rcpt.map((r) => r.text),
    [atRcpt(inbox.address, 'no such inbox')],
  );
  assert.deepEqual(Object.values(await footprint(s, inbox.inbox_id)), [0, 0, 0, 0, 0, 0, 0, 0, 0]);

  // The provision key was forgotten after IDEMPOTENCY_TTL_SECONDS: the same key provisions a new inbox.
  assert.equal(
    await scalar(s, 'SELECT count(*) FROM provision_idempotency'),
    0,
    'forget-idempotency removed the record',
  );
  const again = await s.api.post('/v1/inboxes', { body: {}, headers: { 'idempotency-key': 'e2e-key-1' } });
  assert.equal(again.status, 201);
  assert.equal(again.headers.get('idempotent-replayed'), null);
  assert.notEqual(again.json.inbox_id, inbox.inbox_id);
});

test('a rejection is listed, then gone REJECTION_RETENTION_SECONDS after poll first listed it; rejection_count stays', async () => {
  const inbox = (await s.api.post('/v1/inboxes', { body: { sender_domains: ['other.test'] } }))
    .json as ProvisionedInbox;
  const replies = await send(inbox, 'not admitted');
  assert.equal(replies.end?.text, '451 4.7.1 svc.test: sender not allowed by this inbox, try again later');
  const first = (await get(inbox, '/messages')).json;
  assert.equal(first.rejections.length, 1);
  assert.equal(first.rejections[0].reason, 'sender_not_allowed');

  s.clock.advance(9);
  await sweep();
  assert.equal((await get(inbox, '/messages')).json.rejections.length, 1);
  s.clock.advance(1);
  await sweep();
  const later = (await get(inbox, '/messages')).json;
  assert.deepEqual(later.rejections, []);
  assert.equal(later.inbox.rejection_count, 1);
  assert.equal((await footprint(s, inbox.inbox_id)).rejections, 0);
});
