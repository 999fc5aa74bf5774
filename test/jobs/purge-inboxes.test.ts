/**
 * purge-inboxes (contract section 3, `expired` -> purged, cancelled -> purged): PURGE_AFTER_SECONDS after
 * expiry (a cancelled inbox: at expires_at) the inbox goes with its credentials, rejections, messages,
 * tombstones, extend keys and rate buckets; the API answers 401 and the policy `no such inbox` before
 * and after. An inbox not yet due stays; one whose messages still hold content waits for expire-inboxes.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import pg from 'pg';
import { TOKENS } from '../../src/container.ts';
import { newMessageId } from '../../src/core/ids.ts';
import type { ProvisionedInbox } from '../../src/core/inbox-service.ts';
import type { RecipientAdmission } from '../../src/core/recipient-admission.ts';
import { type Harness, startHarness } from '../support/harness.ts';
import { footprint, testJobs } from '../support/jobs.ts';

let h: Harness;
before(async () => {
  h = await startHarness({ POLL_RATE_BURST: '100000', DOWNLOAD_RATE_BURST: '100000' });
});
after(() => h.close());

const status = (inbox: ProvisionedInbox) =>
  h.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.owner });

function advanceTo(isoTime: string, seconds = 0): void {
  h.clock.advance((Date.parse(isoTime) + seconds * 1000 - h.clock.now().getTime()) / 1000);
}

/** The policy daemon's RCPT verdict for mail to `inbox`. */
async function rcpt(inbox: ProvisionedInbox): Promise<string> {
  const admission = h.container.resolve<RecipientAdmission>(TOKENS.RecipientAdmission);
  const verdict = await admission.connection().decide({
    protocolState: 'RCPT',
    instance: `i${Math.random()}`,
    clientAddress: '127.0.0.3',
    reverseClientName: 'mail.sender.test',
    sender: 'sender@example.com',
    recipient: inbox.address,
    size: 0,
  });
  return verdict.kind === 'accept' ? 'accept' : verdict.text;
}

test('PURGE_AFTER_SECONDS after expiry the inbox goes with everything it held; 401 and no such inbox before and after', async () => {
  const jobs = testJobs(h);
  const inbox = await h.provision();
  const owner = inbox.credentials.owner;
  await h.api.post(`/v1/inboxes/${inbox.inbox_id}/extend`, {
    token: owner,
    headers: { 'idempotency-key': 'extend-once' },
  });
  const extended = (await status(inbox)).json.expires_at;
  await h.deliver(inbox.inbox_id, 'Subject: one\r\n\r\none\r\n');
  await h.deliver(inbox.inbox_id, 'Subject: two\r\n\r\ntwo\r\n');
  await h.reject(inbox.inbox_id, { envelopeFrom: 'refused@example.net' });
  await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, { token: owner });
  const held = await footprint(h, inbox.inbox_id);
  assert.deepEqual(
    [held.inboxes, held.credentials, held.messages, held.rejections, held.extendKeys, held.rateBuckets],
    [1, 2, 2, 1, 1, 1],
  );

  advanceTo(extended, h.config.purgeAfterSeconds - 1);
  await jobs.sweep();
  assert.equal((await status(inbox)).status, 200, 'expired, not yet purged');
  assert.equal((await footprint(h, inbox.inbox_id)).inboxes, 1);
  assert.match(await rcpt(inbox), /inbox expired/);

  h.clock.advance(1);
  // Purged by the time rule alone, before any job.
  assert.equal((await status(inbox)).status, 401);
  assert.match(await rcpt(inbox), /no such inbox/);
  const report = await jobs.run('purge-inboxes');
  assert.equal(report.counts.inboxes, 1);
  assert.equal(report.counts.messages, 2, 'the tombstones expire-inboxes left');
  assert.deepEqual(await footprint(h, inbox.inbox_id), {
    inboxes: 0,
    credentials: 0,
    messages: 0,
    undeleted: 0,
    chunks: 0,
    chunkBytes: 0,
    rejections: 0,
    extendKeys: 0,
    rateBuckets: 0,
  });
  assert.equal((await status(inbox)).status, 401);
  assert.match(await rcpt(inbox), /no such inbox/);
  assert.deepEqual(
    (await jobs.run('purge-inboxes')).counts,
    { inboxes: 0, messages: 0, waiting: 0 },
    'a second run finds nothing',
  );
});

test('a cancelled inbox is purged at the end of its paid lifetime', async () => {
  const jobs = testJobs(h);
  const inbox = await h.provision();
  await h.deliver(inbox.inbox_id, 'Subject: x\r\n\r\nx\r\n');
  await h.inboxes.cancel(inbox.inbox_id, h.clock.now());
  assert.equal((await status(inbox)).status, 410);
  await jobs.sweep();
  assert.equal((await footprint(h, inbox.inbox_id)).inboxes, 1, 'kept until expires_at: 410 until then');

  advanceTo(inbox.expires_at);
  const report = await jobs.run('purge-inboxes');
  assert.equal(report.counts.inboxes, 1);
  assert.equal((await footprint(h, inbox.inbox_id)).messages, 0);
  assert.equal((await status(inbox)).status, 401);
});

test('an inbox whose messages still hold content waits for expire-inboxes; then the purge completes', async () => {
  const jobs = testJobs(h);
  const inbox = await h.provision();
  await h.deliver(inbox.inbox_id, 'Subject: held\r\n\r\nheld\r\n');
  advanceTo(inbox.expires_at, h.config.purgeAfterSeconds);

  const waiting = await jobs.run('purge-inboxes');
  assert.equal(waiting.counts.waiting, 1);
  assert.equal(waiting.counts.inboxes, 0);
  assert.equal((await footprint(h, inbox.inbox_id)).inboxes, 1);
  assert.equal((await status(inbox)).status, 401, 'purged all the same for every reader');

  await jobs.run('expire-inboxes');
  const done = await jobs.run('purge-inboxes');
  assert.equal(done.counts.inboxes, 1);
  assert.equal((await footprint(h, inbox.inbox_id)).messages, 0);
});

test('purge-inboxes removes tombstones in batches and never purges an inbox that is not due', async () => {
  const inbox = await h.provision();
  const live = await h.provision();
  for (let i = 0; i < 2; i++) {
    await h.api.post(`/v1/inboxes/${live.inbox_id}/extend`, { token: live.credentials.owner });
  }
  for (let i = 0; i < 7; i++) await h.deliver(inbox.inbox_id, `Subject: ${i}\r\n\r\n${i}\r\n`);
  await h.deliver(live.inbox_id, 'Subject: live\r\n\r\nlive\r\n');
  advanceTo(inbox.expires_at, h.config.purgeAfterSeconds);
  const jobs = testJobs(h, { batchRows: 3 });
  await jobs.run('expire-inboxes');
  const report = await jobs.run('purge-inboxes');
  assert.equal(report.counts.inboxes, 1);
  assert.equal(report.counts.messages, 7);
  assert.equal(report.batches, 4, 'the listing, then 3 + 3 + 1 tombstones (the last with the inbox)');
  assert.equal((await footprint(h, live.inbox_id)).messages, 1);
  assert.equal((await status(live)).status, 200);
});

test('a delivery still writing into a due inbox makes that inbox wait; the run goes on with the others at once', async () => {
  const jobs = testJobs(h);
  const busy = await h.provision();
  const idle = await h.provision();
  await h.deliver(idle.inbox_id, 'Subject: x\r\n\r\nx\r\n');
  h.clock.advance(h.config.unitSeconds + h.config.purgeAfterSeconds + 61);
  await jobs.run('expire-inboxes');
  // What the receiver's store does for a message it streams: begin_delivery, then the chunks arrive.
  const delivery = new pg.Client({ connectionString: h.database.url });
  await delivery.connect();
  try {
    await delivery.query('BEGIN');
    await delivery.query('SELECT * FROM begin_delivery($1, $2, $3, $4, $5)', [
      busy.inbox_id,
      newMessageId(),
      'QSTREAMING',
      'a@example.test',
      h.clock.now(),
    ]);
    const started = performance.now();
    const report = await jobs.run('purge-inboxes');
    assert.ok(performance.now() - started < 5_000, 'no lock waited for');
    assert.equal(report.complete, true, report.error);
    assert.equal(report.counts.waiting, 1);
    assert.equal((await footprint(h, idle.inbox_id)).inboxes, 0, 'the other due inbox is purged');
    assert.equal((await footprint(h, busy.inbox_id)).inboxes, 1);
  } finally {
    await delivery.query('ROLLBACK');
    await delivery.end();
  }
  assert.equal((await jobs.run('purge-inboxes')).counts.inboxes, 1);
  assert.equal((await footprint(h, busy.inbox_id)).inboxes, 0);
});
