/**
 * Poll and download racing the deletion job and concurrent mail (contract sections 2, 3 and 4). The
 * job's clock may be a moment ahead of a request's (another host, or a request that started just
 * before the sweep): whatever the order, a message deleted on time is `410` with its real reason,
 * never `lost`; a download finds out before its first byte; a cached poll page does not outlive the
 * events its `has_more` stands on; a poll never counts fewer rejection attempts than it lists.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, test } from 'node:test';
import type { ProvisionedInbox } from '../../src/core/inbox-service.ts';
import type { MessageStore } from '../../src/core/ports.ts';
import type { LogLine } from '../../src/log.ts';
import { type Harness, startHarness } from '../support/harness.ts';
import { testJobs } from '../support/jobs.ts';

let h: Harness;
const logs: LogLine[] = [];
before(async () => {
  h = await startHarness(
    { POLL_RATE_BURST: '100000', DOWNLOAD_RATE_BURST: '100000' },
    { log: (line) => logs.push(line) },
  );
});
after(() => h.close());

const path = (inbox: ProvisionedInbox, id: string) => `/v1/inboxes/${inbox.inbox_id}/messages/${id}`;
const poll = (inbox: ProvisionedInbox, query = '') =>
  h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages${query}`, { token: inbox.credentials.reader });

/** Replaces one method of the harness's message store until `restore()`. */
function intercept<K extends keyof MessageStore>(name: K, replacement: MessageStore[K]): () => void {
  const store = h.messages as unknown as Record<string, unknown>;
  const original = store[name];
  store[name] = replacement;
  return () => {
    store[name] = original;
  };
}

for (const [kind, content] of [
  ['a message', 'Subject: race\r\n\r\nrace body\r\n'],
  ['an empty message', ''],
] as const) {
  test(`${kind} the job deleted on time is 410 downloaded to a request a moment earlier, not lost, and nothing is logged as an error`, async () => {
    const inbox = await h.provision();
    const id = await h.deliver(inbox.inbox_id, content);
    const token = inbox.credentials.reader;
    assert.equal((await h.api.get(path(inbox, id), { token })).status, 200);
    // The job's clock is at delete_after; the request was taken a millisecond before it.
    h.clock.advance(h.config.downloadGraceSeconds);
    await testJobs(h).run('delete-messages');
    h.clock.advance(-0.001);
    logs.length = 0;
    for (const response of [
      await h.api.get(path(inbox, id), { token }),
      await h.api.head(path(inbox, id), { token }),
    ]) {
      assert.equal(response.status, 410);
    }
    const get = await h.api.get(path(inbox, id), { token });
    assert.equal(get.json.error.code, 'message_gone');
    assert.equal(get.json.error.details.reason, 'downloaded');
    assert.deepEqual(
      logs.filter((line) => line.level === 'error'),
      [],
    );
  });
}

test('the job deleting between the lookup and the first byte: the download is 410, not a dropped connection', async () => {
  const inbox = await h.provision();
  const id = await h.deliver(inbox.inbox_id, randomBytes(600_000));
  const token = inbox.credentials.reader;
  assert.equal((await h.api.get(path(inbox, id), { token })).status, 200);
  h.clock.advance(h.config.downloadGraceSeconds - 0.001);
  const jobs = testJobs(h);
  const original = h.messages.markDownloaded.bind(h.messages);
  const restore = intercept('markDownloaded', async (...args) => {
    h.clock.advance(0.002);
    await jobs.run('delete-messages');
    return original(...args);
  });
  try {
    const response = await h.api.get(path(inbox, id), { token });
    assert.equal(response.status, 410);
    assert.equal(response.json.error.details.reason, 'downloaded');
  } finally {
    restore();
  }
});

test('a cached poll page ends when an event beyond it is deleted: has_more turns false', async () => {
  const inbox = await h.provision();
  const first = await h.deliver(inbox.inbox_id, 'Subject: one\r\n\r\none\r\n');
  const second = await h.deliver(inbox.inbox_id, 'Subject: two\r\n\r\ntwo\r\n');
  assert.equal((await h.api.get(path(inbox, second), { token: inbox.credentials.reader })).status, 200);
  assert.equal((await poll(inbox, '?limit=1')).json.messages[0].message_id, first);
  const cached = await poll(inbox, '?limit=1');
  assert.equal(cached.json.has_more, true);
  h.clock.advance(h.config.downloadGraceSeconds + 1);
  const again = await poll(inbox, '?limit=1');
  assert.deepEqual(
    again.json.messages.map((m: { message_id: string }) => m.message_id),
    [first],
  );
  assert.equal(again.json.has_more, false);
});

test('a rejection recorded between the credential lookup and the listing is counted as well as listed', async () => {
  const inbox = await h.provision();
  const original = h.messages.listEvents.bind(h.messages);
  const restore = intercept('listEvents', async (...args) => {
    await h.reject(inbox.inbox_id, { envelopeFrom: 'late@example.net' });
    return original(...args);
  });
  let response: Awaited<ReturnType<typeof poll>>;
  try {
    response = await poll(inbox);
  } finally {
    restore();
  }
  assert.equal(response.json.rejections.length, 1);
  assert.equal(response.json.inbox.rejection_count, 1);
  // The next poll reads the count itself.
  assert.equal((await poll(inbox)).json.inbox.rejection_count, 1);
});
