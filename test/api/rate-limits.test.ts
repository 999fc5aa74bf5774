/**
 * rate-limits - contract sections 4, 5.6, 7 and 8: poll, status and sender-domains share one bucket
 * per inbox, downloads have their own, extend has none; 429 carries Retry-After equal to
 * details.retry_after_seconds; wrong credentials and refused requests never cost a token; and the
 * default limits let an agent poll every second for a couple of minutes, then keep a slower pace.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { TOKENS } from '../../src/container.ts';
import type { InboxService, ProvisionedInbox } from '../../src/core/inbox-service.ts';
import { type ApiResponse, type Harness, startHarness } from '../support/harness.ts';

const POLL_BURST = 3;
const DOWNLOAD_BURST = 2;

let h: Harness;
before(async () => {
  h = await startHarness({
    POLL_RATE_BURST: String(POLL_BURST),
    DOWNLOAD_RATE_BURST: String(DOWNLOAD_BURST),
  });
});
after(() => h.close());

const poll = (inbox: ProvisionedInbox, token = inbox.credentials.reader) =>
  h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, { token });
const status = (inbox: ProvisionedInbox, token = inbox.credentials.reader) =>
  h.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token });
const setSenderDomains = (inbox: ProvisionedInbox, token = inbox.credentials.owner) =>
  h.api.put(`/v1/inboxes/${inbox.inbox_id}/sender-domains`, {
    token,
    body: { sender_domains: ['a.example'] },
  });
const extend = (inbox: ProvisionedInbox, token = inbox.credentials.owner) =>
  h.api.post(`/v1/inboxes/${inbox.inbox_id}/extend`, { token });
const download = (inbox: ProvisionedInbox, messageId: string, token = inbox.credentials.reader) =>
  h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages/${messageId}`, { token });

/** Asserts a 429 whose Retry-After header equals details.retry_after_seconds; returns that number. */
function assertRateLimited(response: ApiResponse): number {
  assert.equal(response.status, 429, response.text);
  assert.equal(response.json.error.code, 'rate_limited');
  const seconds = response.json.error.details?.retry_after_seconds;
  assert.ok(Number.isInteger(seconds) && seconds >= 1, `retry_after_seconds ${seconds}`);
  assert.equal(response.headers.get('retry-after'), String(seconds));
  return seconds;
}

async function exhaustPollBucket(inbox: ProvisionedInbox): Promise<void> {
  for (let i = 0; i < POLL_BURST; i++) {
    const response = await status(inbox);
    assert.equal(response.status, 200, `call ${i + 1}: ${response.text}`);
  }
  assertRateLimited(await status(inbox));
}

test(`poll past the limit answers 429 rate_limited with Retry-After equal to details.retry_after_seconds`, async () => {
  const inbox = await h.provision();
  for (let i = 0; i < POLL_BURST; i++) assert.equal((await poll(inbox)).status, 200);
  assertRateLimited(await poll(inbox));
});

test('status past the limit answers 429 rate_limited with Retry-After', async () => {
  const inbox = await h.provision();
  for (let i = 0; i < POLL_BURST; i++) assert.equal((await status(inbox)).status, 200);
  assertRateLimited(await status(inbox));
});

test('set sender domains past the limit answers 429 rate_limited with Retry-After', async () => {
  const inbox = await h.provision();
  for (let i = 0; i < POLL_BURST; i++) assert.equal((await setSenderDomains(inbox)).status, 200);
  assertRateLimited(await setSenderDomains(inbox));
});

test('poll, status and sender-domains share one bucket per inbox', async () => {
  const inbox = await h.provision();
  assert.equal((await poll(inbox)).status, 200);
  assert.equal((await status(inbox)).status, 200);
  assert.equal((await setSenderDomains(inbox)).status, 200);
  assertRateLimited(await poll(inbox));
  assertRateLimited(await status(inbox));
  assertRateLimited(await setSenderDomains(inbox));
});

test('owner and reader credentials share the bucket', async () => {
  const inbox = await h.provision();
  assert.equal((await status(inbox, inbox.credentials.owner)).status, 200);
  assert.equal((await status(inbox, inbox.credentials.reader)).status, 200);
  assert.equal((await poll(inbox, inbox.credentials.owner)).status, 200);
  assertRateLimited(await poll(inbox, inbox.credentials.reader));
  assertRateLimited(await status(inbox, inbox.credentials.owner));
});

test('buckets are per inbox: an exhausted inbox does not slow another', async () => {
  const a = await h.provision();
  const b = await h.provision();
  await exhaustPollBucket(a);
  for (let i = 0; i < POLL_BURST; i++) assert.equal((await poll(b)).status, 200);
});

test('waiting Retry-After seconds lets the same request through', async () => {
  const inbox = await h.provision();
  for (let i = 0; i < POLL_BURST; i++) await poll(inbox);
  const first = await poll(inbox);
  const seconds = assertRateLimited(first);
  h.clock.advance(seconds);
  const retried = await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, {
    token: inbox.credentials.reader,
  });
  assert.equal(retried.status, 200, retried.text);
});

test('a refused request does not consume a token: repeated 429s do not push Retry-After further out', async () => {
  const inbox = await h.provision();
  await exhaustPollBucket(inbox);
  const first = assertRateLimited(await poll(inbox));
  for (let i = 0; i < 5; i++) assert.ok(assertRateLimited(await poll(inbox)) <= first);
  h.clock.advance(first);
  assert.equal((await poll(inbox)).status, 200);
});

test('advancing the clock refills the bucket, one token per interval, up to the burst', async () => {
  const inbox = await h.provision();
  await exhaustPollBucket(inbox);
  h.clock.advance(1 / h.config.pollRatePerSecond);
  assert.equal((await poll(inbox)).status, 200);
  assertRateLimited(await poll(inbox));
  h.clock.advance(600);
  for (let i = 0; i < POLL_BURST; i++)
    assert.equal((await status(inbox, inbox.credentials.owner)).status, 200);
  assertRateLimited(await status(inbox));
});

test('a wrong credential never consumes tokens', async () => {
  const inbox = await h.provision();
  const other = await h.provision();
  const wrong = [
    undefined,
    'xyz',
    `rmr_${'3'.repeat(32)}`,
    other.credentials.owner,
    other.credentials.reader,
  ];
  for (let i = 0; i < 3; i++) {
    for (const token of wrong) {
      const response = await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, token ? { token } : {});
      assert.equal(response.status, 401, response.text);
      const put = await h.api.put(`/v1/inboxes/${inbox.inbox_id}/sender-domains`, {
        ...(token ? { token } : {}),
        body: { sender_domains: [] },
      });
      assert.equal(put.status, 401, put.text);
    }
  }
  for (let i = 0; i < POLL_BURST; i++) assert.equal((await poll(inbox)).status, 200);
  assertRateLimited(await poll(inbox));
  // ... nor on the foreign credential's own inbox.
  for (let i = 0; i < POLL_BURST; i++) assert.equal((await poll(other)).status, 200);
});

test('a malformed request is answered 400 before the rate limit and consumes no token', async () => {
  const inbox = await h.provision();
  for (let i = 0; i < 5; i++) {
    assert.equal(
      (await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages?limit=0`, { token: inbox.credentials.reader }))
        .status,
      400,
    );
    assert.equal(
      (await h.api.get(`/v1/inboxes/${inbox.inbox_id}?x=1`, { token: inbox.credentials.reader })).status,
      400,
    );
  }
  for (let i = 0; i < POLL_BURST; i++) assert.equal((await poll(inbox)).status, 200);
  // With the bucket empty, a malformed request still answers 400, not 429.
  const malformed = await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages?cursor=nope`, {
    token: inbox.credentials.reader,
  });
  assert.equal(malformed.status, 400, malformed.text);
  assert.equal(malformed.json.error.code, 'invalid_request');
});

test('the reader on set sender domains answers 403 before the rate limit and consumes no token', async () => {
  const inbox = await h.provision();
  for (let i = 0; i < 5; i++)
    assert.equal((await setSenderDomains(inbox, inbox.credentials.reader)).status, 403);
  await exhaustPollBucket(inbox);
  const forbidden = await setSenderDomains(inbox, inbox.credentials.reader);
  assert.equal(forbidden.status, 403, forbidden.text);
});

test('a cancelled inbox answers 410 even when its bucket is empty', async () => {
  const inbox = await h.provision();
  await exhaustPollBucket(inbox);
  await h.container.resolve<InboxService>(TOKENS.InboxService).cancel(inbox.inbox_id);
  const response = await poll(inbox);
  assert.equal(response.status, 410, response.text);
  assert.equal(response.json.error.code, 'inbox_cancelled');
});

test('extend is not rate limited and takes no poll token', async () => {
  const inbox = await h.provision();
  for (let i = 0; i < 10; i++) assert.equal((await extend(inbox)).status, 200);
  for (let i = 0; i < POLL_BURST; i++) assert.equal((await poll(inbox)).status, 200);
  assertRateLimited(await poll(inbox));
  for (let i = 0; i < 10; i++) {
    const response = await extend(inbox);
    assert.equal(response.status, 200, response.text);
  }
});

test('downloads have their own bucket: past its limit a download answers 429 while poll still works', async () => {
  const inbox = await h.provision();
  const id = await h.deliver(inbox.inbox_id, 'Subject: x\r\n\r\nhello\r\n');
  for (let i = 0; i < DOWNLOAD_BURST; i++) {
    const response = await download(inbox, id);
    assert.equal(response.status, 200, response.text);
  }
  const seconds = assertRateLimited(await download(inbox, id, inbox.credentials.owner));
  for (let i = 0; i < POLL_BURST; i++) assert.equal((await poll(inbox)).status, 200);
  h.clock.advance(seconds);
  const retried = await download(inbox, id);
  assert.equal(retried.status, 200, retried.text);
  assert.equal(retried.text, 'Subject: x\r\n\r\nhello\r\n');
});

test('a 429 on poll does not affect downloads', async () => {
  const inbox = await h.provision();
  const ids = [
    await h.deliver(inbox.inbox_id, 'Subject: 1\r\n\r\none\r\n'),
    await h.deliver(inbox.inbox_id, 'Subject: 2\r\n\r\ntwo\r\n'),
  ];
  await exhaustPollBucket(inbox);
  assertRateLimited(await poll(inbox));
  for (const id of ids) {
    const response = await download(inbox, id);
    assert.equal(response.status, 200, response.text);
  }
  assertRateLimited(await poll(inbox));
});

test('HEAD on a download counts against the download bucket', async () => {
  const inbox = await h.provision();
  const id = await h.deliver(inbox.inbox_id, 'Subject: x\r\n\r\nhello\r\n');
  for (let i = 0; i < DOWNLOAD_BURST; i++) {
    const head = await h.api.head(`/v1/inboxes/${inbox.inbox_id}/messages/${id}`, {
      token: inbox.credentials.reader,
    });
    assert.equal(head.status, 200);
  }
  const head = await h.api.head(`/v1/inboxes/${inbox.inbox_id}/messages/${id}`, {
    token: inbox.credentials.reader,
  });
  assert.equal(head.status, 429);
  assert.ok(Number(head.headers.get('retry-after')) >= 1);
});

describe('with the default limits', () => {
  let d: Harness;
  before(async () => {
    d = await startHarness();
  });
  after(() => d.close());

  test('an agent polling once per second for two minutes, then every two seconds for five more, is never limited', async () => {
    const inbox = await d.provision();
    let url = `/v1/inboxes/${inbox.inbox_id}/messages`;
    const follow = async (second: number) => {
      const response = await d.api.get(url, { token: inbox.credentials.reader });
      assert.equal(response.status, 200, `at ${second} s: ${response.text}`);
      url = response.json.next_url;
    };
    let second = 0;
    for (; second < 120; second++) {
      await follow(second);
      d.clock.advance(1);
    }
    for (const end = second + 300; second < end; second += 2) {
      await follow(second);
      d.clock.advance(2);
    }
  });

  test('status and sender-domains calls mixed into a once-per-second poll loop for two minutes are never limited', async () => {
    const inbox = await d.provision();
    for (let second = 0; second < 120; second++) {
      const response =
        second % 30 === 0
          ? await d.api.put(`/v1/inboxes/${inbox.inbox_id}/sender-domains`, {
              token: inbox.credentials.owner,
              body: { sender_domains: [] },
            })
          : second % 2
            ? await d.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.owner })
            : await d.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, { token: inbox.credentials.reader });
      assert.equal(response.status, 200, `at ${second} s: ${response.text}`);
      d.clock.advance(1);
    }
  });
});
