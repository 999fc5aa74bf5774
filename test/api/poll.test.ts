/**
 * Poll: GET /v1/inboxes/{id}/messages (contract section 2 "Message summary", "Poll response";
 * section 4 poll rules 1-7). The default rate limits are kept: each test polls its own inbox, and the
 * 429 test exhausts one inbox's bucket on purpose.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { newMessageId } from '../../src/core/ids.ts';
import type { ProvisionedInbox } from '../../src/core/inbox-service.ts';
import { expectError, iso, plus } from '../support/assertions.ts';
import { type ApiResponse, type Harness, startHarness } from '../support/harness.ts';

let h: Harness;
before(async () => {
  h = await startHarness();
});
after(() => h.close());

const messagesPath = (inbox: ProvisionedInbox, query = '') =>
  `/v1/inboxes/${inbox.inbox_id}/messages${query}`;

async function poll(inbox: ProvisionedInbox, query = ''): Promise<ApiResponse> {
  const response = await h.api.get(messagesPath(inbox, query), { token: inbox.credentials.reader });
  assert.equal(response.status, 200, response.text);
  return response;
}

async function follow(inbox: ProvisionedInbox, url: string): Promise<ApiResponse> {
  const response = await h.api.get(url, { token: inbox.credentials.reader });
  assert.equal(response.status, 200, response.text);
  return response;
}

test('poll lists a delivered message with every MessageSummary field taken from its delivery', async () => {
  const inbox = await h.provision();
  const raw = 'From: Ada <ada@example.org>\r\nSubject: =?UTF-8?Q?Gr=C3=BC=C3=9Fe?=\r\n\r\nhello\r\n';
  const authentication = {
    dmarc: { result: 'pass', domain: 'example.org' },
    dkim: { result: 'pass', domain: 'example.org' },
    spf: { result: 'softfail', domain: 'bounce.example.org' },
  };
  const receivedAt = iso(h.clock.now());
  const messageId = await h.deliver(inbox.inbox_id, raw, {
    envelopeFrom: 'bounces+1@bounce.example.org',
    summary: {
      fromName: 'Ada Lovelace',
      fromAddress: 'ada@example.org',
      subject: 'Grüße',
      internetMessageId: '<abc.123@example.org>',
      authentication,
    },
  });
  h.clock.advance(7);

  const response = await poll(inbox);
  const body = response.json;
  assert.equal(body.server_time, iso(h.clock.now()));
  assert.deepEqual(body.messages, [
    {
      message_id: messageId,
      url: `${h.config.publicBaseUrl}/v1/inboxes/${inbox.inbox_id}/messages/${messageId}`,
      from: { name: 'Ada Lovelace', address: 'ada@example.org' },
      envelope_from: 'bounces+1@bounce.example.org',
      subject: 'Grüße',
      size_bytes: Buffer.byteLength(raw),
      received_at: receivedAt,
      downloaded_at: null,
      delete_after: plus(body.server_time, h.config.unclaimedSeconds),
      internet_message_id: '<abc.123@example.org>',
      authentication,
    },
  ]);
  assert.deepEqual(body.rejections, []);
  assert.equal(body.has_more, false);

  const download = await h.api.get(body.messages[0].url, { token: inbox.credentials.reader });
  assert.equal(download.status, 200);
  assert.equal(download.text, raw);
});

test('from is what delivery read from From: (a name without an address keeps address null), and absent fields are null', async () => {
  const inbox = await h.provision();
  // The envelope sender stands in only for a missing From:, when the receiver reads the header; a From:
  // with a name and no address must not be shown with the envelope sender beside the name.
  await h.deliver(inbox.inbox_id, 'From: PayPal Security\r\n\r\nbody\r\n', {
    envelopeFrom: 'robot@sender.example',
    summary: {
      fromName: 'PayPal Security',
      fromAddress: null,
      subject: null,
      internetMessageId: null,
      authentication: null,
    },
  });
  const [message] = (await poll(inbox)).json.messages;
  assert.deepEqual(message.from, { name: 'PayPal Security', address: null });
  assert.equal(message.envelope_from, 'robot@sender.example');
  assert.equal(message.subject, null);
  assert.equal(message.internet_message_id, null);
  assert.equal(message.authentication, null);
});

test('a message with the null envelope sender and no From address lists from.address null', async () => {
  const inbox = await h.provision();
  await h.deliver(inbox.inbox_id, 'X: y\r\n\r\nbounce\r\n', {
    envelopeFrom: '',
    summary: { fromName: null, fromAddress: null },
  });
  const [message] = (await poll(inbox)).json.messages;
  assert.equal(message.envelope_from, '');
  assert.deepEqual(message.from, { name: null, address: null });
});

test('HEAD on poll is no endpoint (404) and lists nothing: the first GET after it starts the timers', async () => {
  const inbox = await h.provision();
  await h.deliver(inbox.inbox_id, 'Subject: head\r\n\r\nhead\r\n');
  const head = await h.api.request('HEAD', messagesPath(inbox), { token: inbox.credentials.reader });
  assert.equal(head.status, 404);
  h.clock.advance(600);
  const body = (await poll(inbox)).json;
  assert.equal(body.messages.length, 1);
  assert.equal(body.messages[0].delete_after, plus(body.server_time, h.config.unclaimedSeconds));
});

test('messages are listed oldest first', async () => {
  const inbox = await h.provision();
  const ids: string[] = [];
  const times: string[] = [];
  for (let i = 0; i < 4; i++) {
    times.push(iso(h.clock.now()));
    ids.push(
      await h.deliver(inbox.inbox_id, `Subject: ${i}\r\n\r\n${i}\r\n`, { summary: { subject: `${i}` } }),
    );
    h.clock.advance(3);
  }
  const { messages } = (await poll(inbox)).json;
  assert.deepEqual(
    messages.map((m: { message_id: string }) => m.message_id),
    ids,
  );
  assert.deepEqual(
    messages.map((m: { received_at: string }) => m.received_at),
    times,
  );
});

test('rejections are listed oldest first with their fields', async () => {
  const inbox = await h.provision();
  const first = iso(h.clock.now());
  await h.reject(inbox.inbox_id, { reason: 'quota', envelopeFrom: 'a@one.example', sizeBytes: 10 });
  h.clock.advance(2);
  const second = iso(h.clock.now());
  await h.reject(inbox.inbox_id, {
    reason: 'sender_not_allowed',
    envelopeFrom: 'b@two.example',
    senderDomain: 'two.example',
    sizeBytes: 20,
    internetMessageId: '<m@two.example>',
  });
  const { rejections } = (await poll(inbox)).json;
  assert.deepEqual(rejections, [
    { at: first, envelope_from: 'a@one.example', reason: 'quota', sender_domain: null, size_bytes: 10 },
    {
      at: second,
      envelope_from: 'b@two.example',
      reason: 'sender_not_allowed',
      sender_domain: 'two.example',
      size_bytes: 20,
    },
  ]);
});

test('poll without a cursor lists everything fetchable and every rejection held, on every call', async () => {
  const inbox = await h.provision();
  const a = await h.deliver(inbox.inbox_id, 'Subject: a\r\n\r\na\r\n');
  await h.reject(inbox.inbox_id, { envelopeFrom: 'r1@example.net' });
  const b = await h.deliver(inbox.inbox_id, 'Subject: b\r\n\r\nb\r\n');
  await h.reject(inbox.inbox_id, { envelopeFrom: 'r2@example.net' });

  const first = (await poll(inbox)).json;
  // Downloading keeps the message fetchable inside its grace window, so it is still listed.
  const download = await h.api.get(first.messages[0].url, { token: inbox.credentials.owner });
  assert.equal(download.status, 200);
  const again = (await poll(inbox)).json;
  for (const body of [first, again]) {
    assert.deepEqual(
      body.messages.map((m: { message_id: string }) => m.message_id),
      [a, b],
    );
    assert.deepEqual(
      body.rejections.map((r: { envelope_from: string }) => r.envelope_from),
      ['r1@example.net', 'r2@example.net'],
    );
    assert.equal(body.has_more, false);
  }
  assert.equal(again.messages[0].downloaded_at, iso(h.clock.now()));
  assert.equal(again.messages[1].downloaded_at, null);
});

test('poll with a cursor lists only messages and rejections that arrived after it', async () => {
  const inbox = await h.provision();
  await h.deliver(inbox.inbox_id, 'Subject: old\r\n\r\nold\r\n');
  await h.reject(inbox.inbox_id, { envelopeFrom: 'old@example.net' });
  const first = (await poll(inbox)).json;
  assert.equal(first.messages.length, 1);
  assert.equal(first.rejections.length, 1);

  const empty = (await follow(inbox, first.next_url)).json;
  assert.deepEqual(empty.messages, []);
  assert.deepEqual(empty.rejections, []);
  assert.equal(empty.has_more, false);
  assert.equal(empty.next_cursor, first.next_cursor);

  const fresh = await h.deliver(inbox.inbox_id, 'Subject: new\r\n\r\nnew\r\n');
  await h.reject(inbox.inbox_id, { envelopeFrom: 'new@example.net' });
  const next = (await poll(inbox, `?cursor=${first.next_cursor}`)).json;
  assert.deepEqual(
    next.messages.map((m: { message_id: string }) => m.message_id),
    [fresh],
  );
  assert.deepEqual(
    next.rejections.map((r: { envelope_from: string }) => r.envelope_from),
    ['new@example.net'],
  );
  assert.notEqual(next.next_cursor, first.next_cursor);
});

test('a delivery in flight is not listed, counts in the inbox, and is listed after the cursor once stored', async () => {
  const inbox = await h.provision();
  const raw = 'Subject: slow\r\n\r\nslow body\r\n';
  const queueId = `INFLIGHT${Date.now()}`;
  const reserved = await h.messages.reserve({
    inboxId: inbox.inbox_id,
    messageId: newMessageId(),
    queueId,
    sizeBytes: raw.length,
    envelopeFrom: 'slow@example.com',
    now: h.clock.now(),
  });
  assert.equal(reserved, 'reserved');
  const before = (await poll(inbox)).json;
  assert.deepEqual(before.messages, []);
  assert.equal(before.inbox.message_count, 1);
  assert.equal(before.inbox.quota_used_bytes, raw.length);

  // Another message is stored while the first is still in flight: it is listed on its own.
  const other = await h.deliver(inbox.inbox_id, 'Subject: quick\r\n\r\nquick\r\n');
  const middle = (await follow(inbox, before.next_url)).json;
  assert.deepEqual(
    middle.messages.map((m: { message_id: string }) => m.message_id),
    [other],
  );

  const stored = await h.messages.store(
    {
      inboxId: inbox.inbox_id,
      queueId,
      envelopeFrom: 'slow@example.com',
      now: h.clock.now(),
      summary: {
        fromName: null,
        fromAddress: 'slow@example.com',
        subject: 'slow',
        internetMessageId: null,
        authentication: null,
      },
    },
    (async function* () {
      yield Buffer.from(raw);
    })(),
  );
  assert.equal(stored.kind, 'stored');
  const later = (await follow(inbox, middle.next_url)).json;
  assert.deepEqual(
    later.messages.map((m: { message_id: string }) => m.message_id),
    [stored.messageId],
  );
  assert.equal(later.inbox.message_count, 2);
});

test('limit defaults to 50 and next_url carries it', async () => {
  const inbox = await h.provision();
  for (let i = 0; i < 51; i++) await h.reject(inbox.inbox_id, { envelopeFrom: `r${i}@example.net` });
  const body = (await poll(inbox)).json;
  assert.equal(body.rejections.length, 50);
  assert.equal(body.has_more, true);
  assert.equal(new URL(body.next_url).searchParams.get('limit'), '50');
  const rest = (await follow(inbox, body.next_url)).json;
  assert.deepEqual(
    rest.rejections.map((r: { envelope_from: string }) => r.envelope_from),
    ['r50@example.net'],
  );
  assert.equal(rest.has_more, false);
});

test('limit accepts 1 and 200', async () => {
  const inbox = await h.provision();
  for (let i = 0; i < 3; i++) await h.reject(inbox.inbox_id, { envelopeFrom: `r${i}@example.net` });
  const one = (await poll(inbox, '?limit=1')).json;
  assert.equal(one.rejections.length, 1);
  assert.equal(one.has_more, true);
  const all = (await poll(inbox, '?limit=200')).json;
  assert.equal(all.rejections.length, 3);
  assert.equal(all.has_more, false);
});

test('a limit outside 1 to 200 answers 400 out_of_bounds naming limit with min, max and got', async () => {
  const inbox = await h.provision();
  for (const got of [0, 201, -3, 100000]) {
    const response = await h.api.get(messagesPath(inbox, `?limit=${got}`), {
      token: inbox.credentials.reader,
    });
    expectError(response, 400, 'out_of_bounds');
    assert.deepEqual(response.json.error.details, { field: 'limit', min: 1, max: 200, got });
  }
});

test('a limit that is not an integer answers 400 invalid_request naming limit', async () => {
  const inbox = await h.provision();
  for (const limit of ['abc', '1.5', '', '1e2', '0x10', '%205']) {
    const response = await h.api.get(messagesPath(inbox, `?limit=${limit}`), {
      token: inbox.credentials.reader,
    });
    expectError(response, 400, 'invalid_request');
    assert.equal(response.json.error.details.field, 'limit', `limit=${limit}`);
  }
});

test('an unknown or repeated query parameter answers 400 invalid_request naming it', async () => {
  const inbox = await h.provision();
  const unknown = await h.api.get(messagesPath(inbox, '?since=2020-01-01'), {
    token: inbox.credentials.reader,
  });
  expectError(unknown, 400, 'invalid_request');
  assert.equal(unknown.json.error.details.field, 'since');
  const repeated = await h.api.get(messagesPath(inbox, '?limit=1&limit=2'), {
    token: inbox.credentials.reader,
  });
  expectError(repeated, 400, 'invalid_request');
  assert.equal(repeated.json.error.details.field, 'limit');
});

test('a cursor that is malformed or was never issued answers 400 invalid_request naming cursor', async () => {
  const inbox = await h.provision();
  await h.deliver(inbox.inbox_id, 'Subject: x\r\n\r\nx\r\n');
  const issued = (await poll(inbox)).json.next_cursor;
  assert.equal(issued, '1.1');
  for (const cursor of [
    '1.zzz',
    '1.2',
    '1.00',
    '1.01',
    '2.1',
    '1.',
    '1.A',
    'abc',
    `1.${'1'.repeat(12)}`,
    '1.-1',
  ]) {
    const response = await h.api.get(messagesPath(inbox, `?cursor=${encodeURIComponent(cursor)}`), {
      token: inbox.credentials.reader,
    });
    expectError(response, 400, 'invalid_request');
    assert.equal(response.json.error.details.field, 'cursor', `cursor ${cursor}`);
  }
  // The cursors the service did issue still work.
  for (const cursor of ['1.0', issued]) await poll(inbox, `?cursor=${cursor}`);
});

test('has_more and next_url page through seven events three at a time, each exactly once', async () => {
  const inbox = await h.provision();
  const expected: string[] = [];
  for (let i = 0; i < 7; i++) {
    if (i % 2 === 0) {
      expected.push(await h.deliver(inbox.inbox_id, `Subject: ${i}\r\n\r\n${i}\r\n`));
    } else {
      await h.reject(inbox.inbox_id, { envelopeFrom: `r${i}@example.net` });
      expected.push(`r${i}@example.net`);
    }
    h.clock.advance(1);
  }
  const seen: string[] = [];
  const pages: { count: number; hasMore: boolean }[] = [];
  let body = (await poll(inbox, '?limit=3')).json;
  for (;;) {
    const events = [
      ...body.messages.map((m: { message_id: string; received_at: string }) => [m.received_at, m.message_id]),
      ...body.rejections.map((r: { envelope_from: string; at: string }) => [r.at, r.envelope_from]),
    ].sort((x, y) => (x[0] < y[0] ? -1 : 1));
    seen.push(...events.map((e) => e[1]));
    pages.push({ count: events.length, hasMore: body.has_more });
    const next = new URL(body.next_url);
    assert.equal(next.searchParams.get('cursor'), body.next_cursor);
    assert.equal(next.searchParams.get('limit'), '3');
    if (!body.has_more) break;
    body = (await follow(inbox, body.next_url)).json;
  }
  assert.deepEqual(pages, [
    { count: 3, hasMore: true },
    { count: 3, hasMore: true },
    { count: 1, hasMore: false },
  ]);
  assert.deepEqual(seen, expected);
  const caughtUp = (await follow(inbox, body.next_url)).json;
  assert.deepEqual([caughtUp.messages, caughtUp.rejections, caughtUp.has_more], [[], [], false]);
});

test('next_url is an absolute URL of this poll carrying the cursor and the limit', async () => {
  const inbox = await h.provision();
  const body = (await poll(inbox, '?limit=17')).json;
  assert.equal(
    body.next_url,
    `${h.config.publicBaseUrl}/v1/inboxes/${inbox.inbox_id}/messages?cursor=${body.next_cursor}&limit=17`,
  );
  assert.match(body.next_cursor, /^1\.[0-9a-z]{1,11}$/);
});

test('poll answers with Cache-Control: no-store', async () => {
  const inbox = await h.provision();
  const response = await poll(inbox);
  assert.equal(response.headers.get('cache-control'), 'no-store');
});

test('delete_after is set to UNCLAIMED_SECONDS past server_time at first listing and does not move later', async () => {
  const inbox = await h.provision();
  await h.deliver(inbox.inbox_id, 'Subject: t\r\n\r\nt\r\n');
  h.clock.advance(120); // stored but not listed: no timer runs yet
  const first = (await poll(inbox)).json;
  const deleteAfter = first.messages[0].delete_after;
  assert.equal(deleteAfter, plus(first.server_time, h.config.unclaimedSeconds));
  h.clock.advance(600);
  const later = (await poll(inbox)).json;
  assert.equal(later.messages[0].delete_after, deleteAfter);
  assert.equal(later.server_time, plus(first.server_time, 600));
});

test('delete_after is not clamped to the inbox expires_at', async () => {
  const inbox = await h.provision();
  h.clock.advance(h.config.unitSeconds - 60);
  await h.deliver(inbox.inbox_id, 'Subject: late\r\n\r\nlate\r\n');
  const body = (await poll(inbox)).json;
  assert.equal(body.messages[0].delete_after, plus(body.server_time, h.config.unclaimedSeconds));
  assert.ok(Date.parse(body.messages[0].delete_after) > Date.parse(body.inbox.expires_at));
});

test('a message downloaded before its first listing keeps the earlier delete_after when listed', async () => {
  const inbox = await h.provision();
  const id = await h.deliver(inbox.inbox_id, 'Subject: d\r\n\r\nd\r\n');
  const downloadedAt = iso(h.clock.now());
  const download = await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages/${id}`, {
    token: inbox.credentials.reader,
  });
  assert.equal(download.status, 200);
  h.clock.advance(30);
  const [message] = (await poll(inbox)).json.messages;
  assert.equal(message.downloaded_at, downloadedAt);
  assert.equal(message.delete_after, plus(downloadedAt, h.config.downloadGraceSeconds));
});

test("extending the inbox does not change a listed message's delete_after", async () => {
  const inbox = await h.provision();
  await h.deliver(inbox.inbox_id, 'Subject: e\r\n\r\ne\r\n');
  const before = (await poll(inbox)).json;
  h.clock.advance(10);
  const extend = await h.api.post(`/v1/inboxes/${inbox.inbox_id}/extend`, { token: inbox.credentials.owner });
  assert.equal(extend.status, 200, extend.text);
  assert.equal(extend.json.expires_at, plus(before.inbox.expires_at, h.config.unitSeconds));
  const after = (await poll(inbox)).json;
  assert.equal(after.messages[0].delete_after, before.messages[0].delete_after);
  assert.equal(after.inbox.expires_at, extend.json.expires_at);
});

test('a 429 on poll does not move the cursor: the same URL after Retry-After returns the same events', async () => {
  const inbox = await h.provision();
  await h.deliver(inbox.inbox_id, 'Subject: 1\r\n\r\n1\r\n');
  const first = (await poll(inbox)).json;
  const fresh = await h.deliver(inbox.inbox_id, 'Subject: 2\r\n\r\n2\r\n');
  await h.reject(inbox.inbox_id, { envelopeFrom: 'late@example.net' });

  // Status shares the poll bucket: spend it there, so the new events stay unread behind next_url.
  let spent = false;
  for (let i = 0; i < h.config.pollRateBurst + 5 && !spent; i++) {
    const status = await h.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.reader });
    spent = status.status === 429;
    if (!spent) assert.equal(status.status, 200);
  }
  assert.ok(spent, 'the poll bucket was never exhausted');
  const url = first.next_url;
  const refused = await h.api.get(url, { token: inbox.credentials.reader });
  expectError(refused, 429, 'rate_limited');
  const retryAfter = Number(refused.headers.get('retry-after'));
  assert.ok(Number.isInteger(retryAfter) && retryAfter >= 1);
  assert.equal(refused.json.error.details.retry_after_seconds, retryAfter);

  h.clock.advance(retryAfter);
  const retried = (await follow(inbox, url)).json;
  assert.deepEqual(
    retried.messages.map((m: { message_id: string }) => m.message_id),
    [fresh],
  );
  assert.deepEqual(
    retried.rejections.map((r: { envelope_from: string }) => r.envelope_from),
    ['late@example.net'],
  );
  // The refused request did not list the message: its timer starts at the successful poll.
  assert.equal(retried.messages[0].delete_after, plus(retried.server_time, h.config.unclaimedSeconds));
});

test("poll with another inbox's credential answers 401 unauthorized", async () => {
  const mine = await h.provision();
  const theirs = await h.provision();
  const response = await h.api.get(messagesPath(theirs), { token: mine.credentials.owner });
  expectError(response, 401, 'unauthorized');
});

test('the owner credential polls the same listing as the reader', async () => {
  const inbox = await h.provision();
  const id = await h.deliver(inbox.inbox_id, 'Subject: o\r\n\r\no\r\n');
  const response = await h.api.get(messagesPath(inbox), { token: inbox.credentials.owner });
  assert.equal(response.status, 200);
  assert.equal(response.json.messages[0].message_id, id);
});
