/**
 * Correctness never waits on a job (DESIGN decision 9, STYLE 17): with the jobs stopped, the API and the
 * policy daemon already answer as contract section 3 says at every step of an inbox's life, and a sweep
 * run at that step changes none of those answers. The jobs only free space.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { TOKENS } from '../../src/container.ts';
import type { ProvisionedInbox } from '../../src/core/inbox-service.ts';
import type { RecipientAdmission } from '../../src/core/recipient-admission.ts';
import { EXPIRE_SETTLE_SECONDS } from '../../src/jobs/expire-inboxes.ts';
import { type Harness, startHarness } from '../support/harness.ts';
import { footprint, testJobs } from '../support/jobs.ts';

let h: Harness;
before(async () => {
  h = await startHarness({ POLL_RATE_BURST: '100000', DOWNLOAD_RATE_BURST: '100000' });
});
after(() => h.close());

/** Everything a client can observe of `inbox` without changing it (HEAD starts no timer). */
async function observe(inbox: ProvisionedInbox, messageIds: string[]) {
  const token = inbox.credentials.reader;
  const status = await h.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token });
  const poll = await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, { token });
  const downloads: unknown[] = [];
  for (const id of messageIds) {
    const url = `/v1/inboxes/${inbox.inbox_id}/messages/${id}`;
    const head = await h.api.head(url, { token });
    downloads.push(
      head.status === 200
        ? 200
        : [head.status, (await h.api.get(url, { token })).json?.error?.details ?? null],
    );
  }
  const admission = h.container.resolve<RecipientAdmission>(TOKENS.RecipientAdmission);
  const rcpt = await admission.connection().decide({
    protocolState: 'RCPT',
    instance: `probe-${Math.random()}`,
    clientAddress: '127.0.0.3',
    reverseClientName: 'mail.sender.test',
    sender: 'sender@example.com',
    recipient: inbox.address,
    size: 0,
  });
  return {
    status: [status.status, status.json],
    poll: [poll.status, poll.json],
    downloads,
    smtp: rcpt.kind === 'accept' ? 'accept' : rcpt.text,
  };
}

test('at every step of an inbox life the answers are the contract’s before any job, and the same after a sweep', async () => {
  const jobs = testJobs(h);
  const inbox = await h.provision();
  const fetched = await h.deliver(inbox.inbox_id, 'Subject: fetched\r\n\r\nfetched\r\n');
  const listed = await h.deliver(inbox.inbox_id, 'Subject: listed\r\n\r\nlisted\r\n');
  await h.reject(inbox.inbox_id, { envelopeFrom: 'refused@example.net' });
  const ids = [fetched, listed];
  h.clock.advance(10);
  await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, { token: inbox.credentials.reader });
  assert.equal(
    (
      await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages/${fetched}`, {
        token: inbox.credentials.reader,
      })
    ).status,
    200,
  );

  const step = async (seconds: number, expect: (seen: Awaited<ReturnType<typeof observe>>) => void) => {
    h.clock.advance(seconds);
    const before = await observe(inbox, ids);
    expect(before);
    await jobs.sweep();
    assert.deepEqual(await observe(inbox, ids), before, 'a sweep changes no answer');
  };

  await step(h.config.downloadGraceSeconds, (seen) => {
    assert.deepEqual(seen.downloads, [[410, { reason: 'downloaded' }], 200]);
    assert.equal(seen.status[1].message_count, 1);
    assert.equal(seen.smtp, 'accept');
  });
  await step(h.config.unitSeconds - h.config.downloadGraceSeconds - 10, (seen) => {
    assert.equal(seen.status[1].state, 'expired');
    assert.equal(seen.status[1].message_count, 1, 'the final counts');
    assert.deepEqual(seen.poll[1].messages, []);
    assert.equal(seen.poll[1].rejections.length, 1, 'listed until an hour after first listing');
    assert.deepEqual(seen.downloads, [
      [410, { reason: 'downloaded' }],
      [410, { reason: 'expired' }],
    ]);
    assert.match(seen.smtp, /inbox expired/);
  });
  await step(EXPIRE_SETTLE_SECONDS + 1, (seen) => {
    assert.equal(seen.status[1].message_count, 1);
    assert.match(seen.smtp, /inbox expired/);
  });
  assert.equal((await footprint(h, inbox.inbox_id)).chunks, 0, 'the sweep freed the content');
  await step(h.config.purgeAfterSeconds, (seen) => {
    assert.equal(seen.status[0], 401);
    assert.equal(seen.poll[0], 401);
    assert.deepEqual(seen.downloads, [
      [401, null],
      [401, null],
    ]);
    assert.match(seen.smtp, /no such inbox/);
  });
  assert.equal((await footprint(h, inbox.inbox_id)).inboxes, 0, 'the sweep purged it');
});
