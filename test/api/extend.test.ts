/**
 * extend - POST /v1/inboxes/{id}/extend (contract sections 3, 4, 5.7 and 7): one unit added to the
 * current expiry, the empty body, the error table, and idempotency scoped to the inbox.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import pg from 'pg';
import { TOKENS } from '../../src/container.ts';
import type { InboxService, ProvisionedInbox } from '../../src/core/inbox-service.ts';
import { expectError } from '../support/assertions.ts';
import { duringCancel } from '../support/cancel-race.ts';
import { type ApiResponse, type Harness, startHarness } from '../support/harness.ts';

const UNIT = 3600;
const QUOTA = 104857600;

let h: Harness;
before(async () => {
  h = await startHarness();
});
after(() => h.close());

let keyCounter = 0;
const freshKey = (): string => `extend-key-${process.pid}-${Date.now()}-${++keyCounter}`;

function extend(
  inbox: ProvisionedInbox,
  options: { token?: string; body?: unknown; key?: string; headers?: Record<string, string> } = {},
): Promise<ApiResponse> {
  const headers: Record<string, string> = { ...options.headers };
  if (options.key !== undefined) headers['idempotency-key'] = options.key;
  return h.api.post(`/v1/inboxes/${inbox.inbox_id}/extend`, {
    token: options.token ?? inbox.credentials.owner,
    body: options.body,
    headers,
  });
}

async function expiresAt(inbox: ProvisionedInbox): Promise<number> {
  const status = await h.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.reader });
  assert.equal(status.status, 200, status.text);
  return Date.parse(status.json.expires_at);
}

test('extend with the owner credential and no body adds one unit to expires_at and answers the inbox status', async () => {
  const inbox = await h.provision(['keep.example']);
  const response = await extend(inbox);
  assert.equal(response.status, 200, response.text);
  assert.equal(response.headers.get('idempotent-replayed'), null);
  const body = response.json;
  assert.deepEqual(Object.keys(body).sort(), [
    'address',
    'created_at',
    'expires_at',
    'inbox_id',
    'message_count',
    'quota_bytes',
    'quota_used_bytes',
    'rejection_count',
    'sender_domains',
    'state',
  ]);
  assert.equal(body.inbox_id, inbox.inbox_id);
  assert.equal(body.address, inbox.address);
  assert.equal(body.state, 'live');
  assert.equal(body.created_at, inbox.created_at);
  assert.equal(Date.parse(body.expires_at), Date.parse(inbox.expires_at) + UNIT * 1000);
  assert.equal(body.quota_bytes, QUOTA);
  assert.deepEqual(body.sender_domains, ['keep.example']);
  assert.equal(await expiresAt(inbox), Date.parse(body.expires_at));
});

test('extend adds the unit to the current expiry, not to now, and leaves the quota unchanged', async () => {
  const inbox = await h.provision();
  h.clock.advance(1000);
  const response = await extend(inbox);
  assert.equal(response.status, 200, response.text);
  assert.equal(Date.parse(response.json.expires_at), Date.parse(inbox.expires_at) + UNIT * 1000);
  assert.equal(response.json.quota_bytes, inbox.quota_bytes);
});

test('extend reports the held messages and rejections in its status', async () => {
  const inbox = await h.provision();
  await h.deliver(inbox.inbox_id, 'Subject: a\r\n\r\nhello\r\n');
  await h.reject(inbox.inbox_id, { reason: 'quota', sizeBytes: 99 });
  const response = await extend(inbox);
  assert.equal(response.status, 200, response.text);
  assert.equal(response.json.message_count, 1);
  assert.equal(response.json.quota_used_bytes, 'Subject: a\r\n\r\nhello\r\n'.length);
  assert.equal(response.json.rejection_count, 1);
});

test('extend accepts no body, {} and an empty object with whitespace', async () => {
  const inbox = await h.provision();
  const bodies: (string | undefined)[] = [undefined, '', '{}', ' { } \n', '\n'];
  let expected = Date.parse(inbox.expires_at);
  for (const body of bodies) {
    const response = await extend(inbox, { body });
    assert.equal(response.status, 200, `${JSON.stringify(body)}: ${response.text}`);
    expected += UNIT * 1000;
    assert.equal(Date.parse(response.json.expires_at), expected, JSON.stringify(body));
  }
  const plain = await extend(inbox, { body: '{}', headers: { 'content-type': 'text/plain' } });
  assert.equal(plain.status, 200, plain.text);
});

test('extend can be called again for each further hour: there is no cap on total lifetime', async () => {
  const inbox = await h.provision();
  let last: ApiResponse | undefined;
  for (let i = 0; i < 30; i++) last = await extend(inbox);
  assert.equal(last?.status, 200);
  assert.equal(Date.parse(last?.json.expires_at), Date.parse(inbox.expires_at) + 30 * UNIT * 1000);
  h.clock.advance(24 * 3600);
  const status = await h.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.owner });
  assert.equal(status.json.state, 'live');
});

test('extend with a body that is not empty or a JSON object answers 400 invalid_request', async () => {
  const inbox = await h.provision();
  for (const body of ['{', 'add=1', '[]', '[{}]', '"{}"', 'null', '0', 'true']) {
    const details = expectError(await extend(inbox, { body }), 400, 'invalid_request');
    assert.equal(typeof details.field, 'string', body);
  }
  assert.equal(await expiresAt(inbox), Date.parse(inbox.expires_at));
});

test('extend with any field answers 400 invalid_request with details.field naming it', async () => {
  const inbox = await h.provision();
  for (const field of ['add_lifetime_seconds', 'add_quota_bytes', 'lifetime_seconds', 'units', 'foo']) {
    const details = expectError(await extend(inbox, { body: { [field]: 3600 } }), 400, 'invalid_request');
    assert.equal(details.field, field);
  }
  assert.equal(await expiresAt(inbox), Date.parse(inbox.expires_at));
});

test('extend with a field named like a built-in object property answers 400 naming it and does not extend', async () => {
  const inbox = await h.provision();
  for (const field of ['constructor', '__proto__', 'toString', 'hasOwnProperty', 'valueOf']) {
    const response = await extend(inbox, { body: `{"${field}": {}}` });
    assert.equal(expectError(response, 400, 'invalid_request').field, field);
  }
  assert.equal(await expiresAt(inbox), Date.parse(inbox.expires_at));
});

test('extend with a malformed Idempotency-Key answers 400 invalid_request with details.field Idempotency-Key', async () => {
  const inbox = await h.provision();
  for (const key of ['a key', '', 'k'.repeat(256), 'clé']) {
    const details = expectError(await extend(inbox, { key }), 400, 'invalid_request');
    assert.equal(details.field, 'Idempotency-Key', JSON.stringify(key));
  }
  assert.equal(await expiresAt(inbox), Date.parse(inbox.expires_at));
});

test('extend with a credential problem answers 401 unauthorized', async () => {
  const inbox = await h.provision();
  const other = await h.provision();
  const tokens: (string | undefined)[] = [
    undefined,
    'xyz',
    `rmo_${'0'.repeat(32)}`,
    `rmr_${'0'.repeat(32)}`,
    other.credentials.owner,
    other.credentials.reader,
    inbox.credentials.owner.toUpperCase(),
  ];
  for (const token of tokens) {
    const response = await h.api.post(`/v1/inboxes/${inbox.inbox_id}/extend`, token ? { token } : {});
    expectError(response, 401, 'unauthorized');
    assert.equal(response.json.error.details, undefined);
  }
  assert.equal(await expiresAt(inbox), Date.parse(inbox.expires_at));
  assert.equal(await expiresAt(other), Date.parse(other.expires_at));
});

test('extend with the reader credential answers 403 forbidden', async () => {
  const inbox = await h.provision();
  for (const body of [undefined, '{}']) {
    const response = await extend(inbox, { token: inbox.credentials.reader, body });
    expectError(response, 403, 'forbidden');
    assert.equal(response.json.error.details, undefined);
  }
  assert.equal(await expiresAt(inbox), Date.parse(inbox.expires_at));
});

test('extend after expires_at has passed answers 409 inbox_expired', async () => {
  const inbox = await h.provision();
  h.clock.advance(UNIT - 1);
  const inTime = await extend(inbox);
  assert.equal(inTime.status, 200, inTime.text);
  h.clock.advance(UNIT + 1);
  // Now exactly at the new expires_at: time has reached it, so the inbox is expired.
  const late = await extend(inbox);
  expectError(late, 409, 'inbox_expired');
  assert.equal(late.json.error.details, undefined);
  h.clock.advance(60);
  expectError(await extend(inbox, { key: freshKey() }), 409, 'inbox_expired');
  const status = await h.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.owner });
  assert.equal(status.json.state, 'expired');
  assert.equal(Date.parse(status.json.expires_at), Date.parse(inbox.expires_at) + UNIT * 1000);
});

test('extend on a cancelled inbox answers 410 inbox_cancelled with details.reason abuse and details.cancelled_at', async () => {
  const inbox = await h.provision();
  const cancelledAt = h.clock.now();
  await h.container.resolve<InboxService>(TOKENS.InboxService).cancel(inbox.inbox_id);
  h.clock.advance(5);
  for (const token of [inbox.credentials.owner, inbox.credentials.reader]) {
    const details = expectError(await extend(inbox, { token }), 410, 'inbox_cancelled');
    assert.equal(details.reason, 'abuse');
    assert.equal(details.cancelled_at, cancelledAt.toISOString());
  }
});

test('extend waiting on a cancel that commits first answers 410 inbox_cancelled and does not extend', async () => {
  const inbox = await h.provision();
  const cancelledAt = h.clock.now();
  const response = await duringCancel(h.database.url, inbox.inbox_id, cancelledAt, () => extend(inbox));
  const details = expectError(response, 410, 'inbox_cancelled');
  assert.deepEqual(details, { reason: 'abuse', cancelled_at: cancelledAt.toISOString() });
  const client = new pg.Client({ connectionString: h.database.url });
  await client.connect();
  const row = await client.query('SELECT expires_at FROM inboxes WHERE inbox_id = $1', [inbox.inbox_id]);
  await client.end();
  assert.equal(row.rows[0].expires_at.getTime(), Date.parse(inbox.expires_at));
});

test('extend replay with the same key returns the stored 200 with Idempotent-Replayed: true and extends only once', async () => {
  const inbox = await h.provision();
  const key = freshKey();
  const first = await extend(inbox, { key });
  assert.equal(first.status, 200, first.text);
  assert.equal(first.headers.get('idempotent-replayed'), null);
  h.clock.advance(10);
  for (let i = 0; i < 3; i++) {
    const replay = await extend(inbox, { key });
    assert.equal(replay.status, 200, replay.text);
    assert.equal(replay.headers.get('idempotent-replayed'), 'true');
    assert.deepEqual(replay.json, first.json);
    // The same bytes (contract 5.7): the keys came back reordered by jsonb until 2026-11-25.
    assert.equal(replay.text, first.text);
  }
  assert.equal(await expiresAt(inbox), Date.parse(inbox.expires_at) + UNIT * 1000);
  // A new key is a new paid unit.
  const second = await extend(inbox, { key: freshKey() });
  assert.equal(Date.parse(second.json.expires_at), Date.parse(inbox.expires_at) + 2 * UNIT * 1000);
});

test('extend replay returns the original response even after the inbox changed', async () => {
  const inbox = await h.provision();
  const key = freshKey();
  const first = await extend(inbox, { key });
  await h.deliver(inbox.inbox_id, 'Subject: later\r\n\r\nbody\r\n');
  await extend(inbox);
  const replay = await extend(inbox, { key });
  assert.equal(replay.headers.get('idempotent-replayed'), 'true');
  assert.deepEqual(replay.json, first.json);
  assert.equal(replay.json.message_count, 0);
});

test('extend reusing a key with {} after no body is a replay, never idempotency_conflict', async () => {
  const inbox = await h.provision();
  const key = freshKey();
  const first = await extend(inbox, { key });
  for (const body of ['{}', ' {}', '']) {
    const replay = await extend(inbox, { key, body });
    assert.equal(replay.status, 200, replay.text);
    assert.equal(replay.headers.get('idempotent-replayed'), 'true');
    assert.deepEqual(replay.json, first.json);
  }
  assert.equal(await expiresAt(inbox), Date.parse(inbox.expires_at) + UNIT * 1000);
});

test('concurrent extends with one key extend once', async () => {
  const inbox = await h.provision();
  const key = freshKey();
  const responses = await Promise.all(Array.from({ length: 6 }, () => extend(inbox, { key })));
  for (const response of responses) assert.equal(response.status, 200, response.text);
  assert.equal(responses.filter((r) => r.headers.get('idempotent-replayed') === null).length, 1);
  assert.equal(new Set(responses.map((r) => r.json.expires_at)).size, 1);
  assert.equal(await expiresAt(inbox), Date.parse(inbox.expires_at) + UNIT * 1000);
});

test('extend replay after the inbox expired still returns its stored 200; a new key answers 409 inbox_expired', async () => {
  const inbox = await h.provision();
  const key = freshKey();
  const first = await extend(inbox, { key });
  assert.equal(first.status, 200, first.text);
  h.clock.advance(2 * UNIT + 1);
  const replay = await extend(inbox, { key });
  assert.equal(replay.status, 200, replay.text);
  assert.equal(replay.headers.get('idempotent-replayed'), 'true');
  assert.deepEqual(replay.json, first.json);
  expectError(await extend(inbox, { key: freshKey() }), 409, 'inbox_expired');
  expectError(await extend(inbox), 409, 'inbox_expired');
});

test('extend keys are scoped to the inbox: the same key extends two inboxes', async () => {
  const a = await h.provision();
  const b = await h.provision();
  const key = freshKey();
  const onA = await extend(a, { key });
  const onB = await extend(b, { key });
  for (const [inbox, response] of [
    [a, onA],
    [b, onB],
  ] as const) {
    assert.equal(response.status, 200, response.text);
    assert.equal(response.headers.get('idempotent-replayed'), null);
    assert.equal(response.json.inbox_id, inbox.inbox_id);
    assert.equal(await expiresAt(inbox), Date.parse(inbox.expires_at) + UNIT * 1000);
  }
});

test('extend keys are not shared with provision: a provision key used on extend extends', async () => {
  const key = freshKey();
  const provisioned = await h.api.post('/v1/inboxes', { body: {}, headers: { 'idempotency-key': key } });
  assert.equal(provisioned.status, 201, provisioned.text);
  const inbox = provisioned.json as ProvisionedInbox;
  const response = await extend(inbox, { key });
  assert.equal(response.status, 200, response.text);
  assert.equal(response.headers.get('idempotent-replayed'), null);
  assert.equal(Date.parse(response.json.expires_at), Date.parse(inbox.expires_at) + UNIT * 1000);
});

test('extend with a query parameter answers 400 invalid_request naming it', async () => {
  const inbox = await h.provision();
  const response = await h.api.post(`/v1/inboxes/${inbox.inbox_id}/extend?units=2`, {
    token: inbox.credentials.owner,
  });
  assert.equal(expectError(response, 400, 'invalid_request').field, 'units');
  assert.equal(await expiresAt(inbox), Date.parse(inbox.expires_at));
});
