/**
 * The served API description (GET /v1/openapi.json) against the contract: OpenAPI 3.1.0, version v1,
 * every endpoint of section 4, every error status the contract's tables list for each operation, the
 * documented headers, and the field lists of section 2's objects.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { type Harness, startHarness } from '../support/harness.ts';

let h: Harness;
// biome-ignore lint/suspicious/noExplicitAny: the document is read as plain JSON
let doc: any;
before(async () => {
  h = await startHarness();
  const response = await h.api.get('/v1/openapi.json');
  assert.equal(response.status, 200);
  assert.match(response.headers.get('content-type') ?? '', /^application\/json/);
  doc = response.json;
});
after(() => h.close());

/** Contract section 4: each operation, its success statuses, and the error statuses its text and tables list. */
const OPERATIONS: { method: string; path: string; success: string[]; errors: string[] }[] = [
  { method: 'get', path: '/v1/health', success: ['200'], errors: ['500'] },
  { method: 'post', path: '/v1/inboxes', success: ['201'], errors: ['400', '401', '409', '500'] },
  { method: 'get', path: '/v1/inboxes/{id}', success: ['200'], errors: ['401', '410', '429', '500'] },
  {
    method: 'get',
    path: '/v1/inboxes/{id}/messages',
    success: ['200'],
    errors: ['400', '401', '410', '429', '500'],
  },
  {
    method: 'get',
    path: '/v1/inboxes/{id}/messages/{msg_id}',
    success: ['200', '206'],
    errors: ['401', '404', '410', '416', '429', '500'],
  },
  {
    method: 'head',
    path: '/v1/inboxes/{id}/messages/{msg_id}',
    success: ['200'],
    errors: ['401', '404', '410', '416', '429', '500'],
  },
  {
    method: 'post',
    path: '/v1/inboxes/{id}/extend',
    success: ['200'],
    errors: ['400', '401', '403', '409', '410', '500'],
  },
  {
    method: 'put',
    path: '/v1/inboxes/{id}/sender-domains',
    success: ['200'],
    errors: ['400', '401', '403', '409', '410', '429', '500'],
  },
];

test('GET /v1/openapi.json is an OpenAPI 3.1.0 document of version v1', () => {
  assert.equal(doc.openapi, '3.1.0');
  assert.equal(doc.info.version, 'v1');
  assert.equal(typeof doc.info.title, 'string');
});

test('the document has every path of the contract, and only paths under /v1/', () => {
  for (const { method, path } of OPERATIONS) {
    assert.ok(doc.paths[path], `missing path ${path}`);
    assert.ok(doc.paths[path][method], `missing ${method.toUpperCase()} ${path}`);
  }
  for (const path of Object.keys(doc.paths)) assert.match(path, /^\/v1\//);
  // Planned endpoints are not available and are not described (contract section 1.10).
  assert.equal(doc.paths['/v1/pricing'], undefined);
  assert.equal(doc.paths['/v1/inboxes/{id}/messages/{msg_id}/reply'], undefined);
});

for (const { method, path, success, errors } of OPERATIONS) {
  test(`${method.toUpperCase()} ${path} lists ${[...success, ...errors].join(', ')}`, () => {
    const statuses = Object.keys(doc.paths[path][method].responses);
    for (const status of [...success, ...errors]) {
      assert.ok(statuses.includes(status), `${method.toUpperCase()} ${path} does not list ${status}`);
    }
  });
}

test('every JSON error response of the inbox operations uses the Error schema', () => {
  for (const { method, path, errors } of OPERATIONS) {
    if (method === 'head') continue;
    for (const status of errors) {
      const response = doc.paths[path][method].responses[status];
      assert.deepEqual(
        response.content?.['application/json']?.schema,
        { $ref: '#/components/schemas/Error' },
        `${method.toUpperCase()} ${path} ${status}`,
      );
    }
  }
});

test('inbox operations use the bearer scheme; health and provision take no inbox credential', () => {
  assert.equal(doc.components.securitySchemes.bearer.type, 'http');
  assert.equal(doc.components.securitySchemes.bearer.scheme, 'bearer');
  for (const { method, path } of OPERATIONS) {
    const security = doc.paths[path][method].security;
    if (path === '/v1/health' || path === '/v1/inboxes')
      assert.ok(security === undefined || security.length === 0);
    else assert.deepEqual(security, [{ bearer: [] }], `${method.toUpperCase()} ${path}`);
  }
});

test('429 responses document Retry-After, and 416 documents Content-Range', () => {
  for (const { method, path, errors } of OPERATIONS) {
    if (errors.includes('429') && method !== 'head') {
      assert.ok(doc.paths[path][method].responses['429'].headers?.['Retry-After'], `${method} ${path}`);
    }
  }
  const download = doc.paths['/v1/inboxes/{id}/messages/{msg_id}'].get.responses;
  assert.ok(download['416'].headers['Content-Range']);
  assert.ok(download['206'].headers['Content-Range']);
});

test('every HEAD the server answers is described: status and health too, and a ranged inspect carries Content-Range', async () => {
  const inbox = await h.provision();
  // The harness's client checks each response against the document ("not documented" until 2026-11-25).
  for (const path of [`/v1/inboxes/${inbox.inbox_id}`, '/v1/health', '/v1/openapi.json']) {
    assert.equal((await h.api.head(path, { token: inbox.credentials.reader })).status, 200, path);
  }
  const id = await h.deliver(inbox.inbox_id, 'Subject: r\r\n\r\n0123456789\r\n');
  const ranged = await h.api.head(`/v1/inboxes/${inbox.inbox_id}/messages/${id}`, {
    token: inbox.credentials.reader,
    headers: { range: 'bytes=0-4' },
  });
  assert.equal(ranged.status, 200);
  assert.match(ranged.headers.get('content-range') ?? '', /^bytes 0-4\/\d+$/);
  const inspect = doc.paths['/v1/inboxes/{id}/messages/{msg_id}'].head.responses['200'];
  assert.ok(inspect.headers['Content-Range']);
});

test('the download documents message/rfc822 and its headers; poll documents Cache-Control', () => {
  const download = doc.paths['/v1/inboxes/{id}/messages/{msg_id}'];
  for (const status of ['200', '206']) {
    const response = download.get.responses[status];
    assert.ok(response.content['message/rfc822'], `GET ${status} is message/rfc822`);
    for (const header of ['Content-Length', 'ETag', 'Accept-Ranges', 'Cache-Control']) {
      assert.ok(response.headers[header], `GET ${status} documents ${header}`);
    }
  }
  assert.ok(download.head.responses['200'].headers['Content-Length']);
  assert.equal(download.head.responses['200'].content, undefined, 'HEAD has no body');
  const range = download.get.parameters.find((p: { name: string }) => p.name === 'Range');
  assert.equal(range?.in, 'header');
  assert.ok(doc.paths['/v1/inboxes/{id}/messages'].get.responses['200'].headers['Cache-Control']);
});

test('poll documents the cursor and limit query parameters with the contract bounds', () => {
  const parameters = doc.paths['/v1/inboxes/{id}/messages'].get.parameters;
  const cursor = parameters.find((p: { name: string }) => p.name === 'cursor');
  const limit = parameters.find((p: { name: string }) => p.name === 'limit');
  assert.equal(cursor.in, 'query');
  assert.equal(cursor.required, false);
  assert.equal(new RegExp(cursor.schema.pattern).test('1.0'), true);
  assert.equal(new RegExp(cursor.schema.pattern).test('1.abcdefghijk'), true);
  assert.equal(new RegExp(cursor.schema.pattern).test('1.abcdefghijkl'), false);
  assert.equal(new RegExp(cursor.schema.pattern).test('2.1'), false);
  assert.equal(limit.in, 'query');
  assert.equal(limit.required, false);
  assert.equal(limit.schema.type, 'integer');
  assert.equal(limit.schema.minimum, 1);
  assert.equal(limit.schema.maximum, 200);
  assert.equal(limit.schema.default, 50);
});

test('paid calls document the optional Idempotency-Key header and the Idempotent-Replayed response header', () => {
  for (const [path, method, status] of [
    ['/v1/inboxes', 'post', '201'],
    ['/v1/inboxes/{id}/extend', 'post', '200'],
  ] as const) {
    const operation = doc.paths[path][method];
    const key = operation.parameters.find((p: { name: string }) => p.name === 'Idempotency-Key');
    assert.equal(key?.in, 'header', path);
    assert.equal(key.required, false);
    assert.ok(operation.responses[status].headers['Idempotent-Replayed'], path);
  }
});

test('identifier patterns follow the contract formats', () => {
  const inboxId = new RegExp(doc.components.schemas.InboxStatus.properties.inbox_id.pattern);
  const messageId = new RegExp(doc.components.schemas.MessageSummary.properties.message_id.pattern);
  assert.ok(inboxId.test('0123456789abcdefghjk'));
  for (const bad of [
    '0123456789abcdefghji',
    '0123456789abcdefghjl',
    '0123456789abcdefghjo',
    '0123456789abcdefghju',
  ]) {
    assert.ok(!inboxId.test(bad), bad);
  }
  assert.ok(!inboxId.test('0123456789ABCDEFGHJK'));
  assert.ok(!inboxId.test('0123456789abcdefghj'));
  assert.ok(messageId.test('msg_mnpqrstvwxyz01234567'));
  assert.ok(!messageId.test('msg_mnpqrstvwxyz0123456'));
  const credentials = doc.components.schemas.ProvisionedInbox.properties.credentials.properties;
  assert.ok(new RegExp(credentials.owner.pattern).test(`rmo_${'a'.repeat(32)}`));
  assert.ok(new RegExp(credentials.reader.pattern).test(`rmr_${'z'.repeat(32)}`));
  assert.ok(!new RegExp(credentials.reader.pattern).test(`rmo_${'z'.repeat(32)}`));
});

/** Contract section 2: every field of each object, all required. */
const OBJECTS: Record<string, string[]> = {
  InboxStatus: [
    'inbox_id',
    'address',
    'state',
    'created_at',
    'expires_at',
    'quota_bytes',
    'quota_used_bytes',
    'message_count',
    'rejection_count',
    'sender_domains',
  ],
  ProvisionedInbox: [
    'inbox_id',
    'address',
    'created_at',
    'expires_at',
    'quota_bytes',
    'sender_domains',
    'credentials',
  ],
  MessageSummary: [
    'message_id',
    'url',
    'from',
    'envelope_from',
    'subject',
    'size_bytes',
    'received_at',
    'downloaded_at',
    'delete_after',
    'internet_message_id',
    'authentication',
  ],
  RejectionEvent: ['at', 'envelope_from', 'reason', 'sender_domain', 'size_bytes'],
  PollResponse: ['inbox', 'server_time', 'messages', 'rejections', 'next_cursor', 'next_url', 'has_more'],
  Health: ['ok', 'environment'],
};

for (const [name, fields] of Object.entries(OBJECTS)) {
  test(`${name} has exactly the contract's fields, all required`, () => {
    const schema = doc.components.schemas[name];
    assert.ok(schema, `no schema ${name}`);
    assert.deepEqual(Object.keys(schema.properties).sort(), [...fields].sort());
    assert.deepEqual([...schema.required].sort(), [...fields].sort());
  });
}

test('the Error schema has code and message required and details optional', () => {
  const inner = doc.components.schemas.Error.properties.error;
  assert.deepEqual([...doc.components.schemas.Error.required], ['error']);
  assert.deepEqual([...inner.required].sort(), ['code', 'message']);
  assert.ok(inner.properties.details);
});

test('InboxStatus.state is live or expired', () => {
  const state = doc.components.schemas.InboxStatus.properties.state;
  const values = (state.anyOf ?? state.oneOf ?? []).map((s: { const: string }) => s.const);
  assert.deepEqual((state.enum ?? values).sort(), ['expired', 'live']);
});
