/**
 * provision - POST /v1/inboxes (contract sections 2, 4, 5.7 and 7): the provisioned inbox, the request
 * body and sender_domains rules, the error table, idempotency, closed provisioning, secrets at rest.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import { expectError, INVALID_SENDER_DOMAINS, VALID_SENDER_DOMAINS } from '../support/assertions.ts';
import { type ApiResponse, type Harness, startHarness } from '../support/harness.ts';

const ID = /^[0-9a-hjkmnp-tv-z]{20}$/;
const OWNER = /^rmo_[0-9a-hjkmnp-tv-z]{32}$/;
const READER = /^rmr_[0-9a-hjkmnp-tv-z]{32}$/;
const UNIT = 3600;
const QUOTA = 104857600;

let h: Harness;
before(async () => {
  h = await startHarness();
});
after(() => h.close());

let keyCounter = 0;
const freshKey = (): string => `provision-key-${process.pid}-${Date.now()}-${++keyCounter}`;

function provision(body: unknown, headers: Record<string, string> = {}): Promise<ApiResponse> {
  return h.api.post('/v1/inboxes', { body, headers });
}

test('provision with {} answers 201 with a live inbox of one unit, 104857600 bytes and both credentials', async () => {
  const now = h.clock.now();
  const response = await provision({});
  assert.equal(response.status, 201, response.text);
  assert.equal(response.headers.get('idempotent-replayed'), null);
  const body = response.json;
  assert.deepEqual(Object.keys(body).sort(), [
    'address',
    'created_at',
    'credentials',
    'expires_at',
    'inbox_id',
    'quota_bytes',
    'sender_domains',
  ]);
  assert.match(body.inbox_id, ID);
  assert.equal(body.address, `${body.inbox_id}@inbox.test`);
  assert.equal(body.created_at, now.toISOString());
  assert.equal(Date.parse(body.expires_at) - Date.parse(body.created_at), UNIT * 1000);
  assert.equal(body.quota_bytes, QUOTA);
  assert.deepEqual(body.sender_domains, []);
  assert.deepEqual(Object.keys(body.credentials).sort(), ['owner', 'reader']);
  assert.match(body.credentials.owner, OWNER);
  assert.match(body.credentials.reader, READER);

  for (const token of [body.credentials.owner, body.credentials.reader]) {
    const status = await h.api.get(`/v1/inboxes/${body.inbox_id}`, { token });
    assert.equal(status.status, 200, status.text);
    assert.equal(status.json.state, 'live');
    assert.equal(status.json.created_at, body.created_at);
    assert.equal(status.json.expires_at, body.expires_at);
    assert.equal(status.json.quota_bytes, QUOTA);
  }
});

test('provision issues a different inbox id and different credentials every time', async () => {
  const a = await h.provision();
  const b = await h.provision();
  assert.notEqual(a.inbox_id, b.inbox_id);
  assert.notEqual(a.credentials.owner, b.credentials.owner);
  assert.notEqual(a.credentials.reader, b.credentials.reader);
  assert.notEqual(a.credentials.owner.slice(4), a.credentials.reader.slice(4));
});

test('provision stores sender_domains lowercased, deduplicated and sorted', async () => {
  const response = await provision({
    sender_domains: ['Zeta.example', 'b.example.com', 'A.EXAMPLE.COM', 'B.Example.Com.', 'a.example.com'],
  });
  assert.equal(response.status, 201, response.text);
  assert.deepEqual(response.json.sender_domains, ['a.example.com', 'b.example.com', 'zeta.example']);
  const status = await h.api.get(`/v1/inboxes/${response.json.inbox_id}`, {
    token: response.json.credentials.reader,
  });
  assert.deepEqual(status.json.sender_domains, ['a.example.com', 'b.example.com', 'zeta.example']);
});

test('provision with sender_domains [] takes mail from anyone: the list is empty', async () => {
  const response = await provision({ sender_domains: [] });
  assert.equal(response.status, 201, response.text);
  assert.deepEqual(response.json.sender_domains, []);
});

test('provision accepts every domain name form of section 2 and stores it lowercased', async () => {
  for (const [sent, stored] of VALID_SENDER_DOMAINS) {
    const response = await provision({ sender_domains: [sent] });
    assert.equal(response.status, 201, `${JSON.stringify(sent)}: ${response.text}`);
    assert.deepEqual(response.json.sender_domains, [stored], JSON.stringify(sent));
  }
});

test('provision with a field named like a built-in object property answers 400 invalid_request naming it', async () => {
  for (const field of ['constructor', '__proto__', 'toString', 'hasOwnProperty', 'valueOf']) {
    const details = expectError(await provision(`{"${field}": {"a": 1}}`), 400, 'invalid_request');
    assert.equal(details.field, field);
  }
});

test('provision with an entry that is not a domain name answers 400 invalid_request with details.field', async () => {
  for (const entry of INVALID_SENDER_DOMAINS) {
    const response = await provision({ sender_domains: ['fine.example', entry] });
    const details = expectError(response, 400, 'invalid_request');
    assert.match(String(details.field), /^sender_domains/, JSON.stringify(entry));
  }
});

test('provision with sender_domains that is not an array answers 400 invalid_request naming sender_domains', async () => {
  for (const value of ['example.com', null, 3, { 'example.com': true }]) {
    const details = expectError(await provision({ sender_domains: value }), 400, 'invalid_request');
    assert.equal(details.field, 'sender_domains', JSON.stringify(value));
  }
});

test('provision with more than 20 sender_domains answers 400 out_of_bounds with details.got', async () => {
  const domains = Array.from({ length: 21 }, (_, i) => `d${i}.example`);
  const details = expectError(await provision({ sender_domains: domains }), 400, 'out_of_bounds');
  assert.equal(details.field, 'sender_domains');
  assert.equal(typeof details.min, 'number');
  assert.equal(details.max, 20);
  assert.equal(details.got, 21);
});

test('provision counts the entries sent, before deduplication, against the limit of 20', async () => {
  const domains = Array.from({ length: 25 }, () => 'same.example');
  const details = expectError(await provision({ sender_domains: domains }), 400, 'out_of_bounds');
  assert.equal(details.got, 25);
});

test('provision with exactly 20 sender_domains is accepted', async () => {
  const domains = Array.from({ length: 20 }, (_, i) => `d${String(i).padStart(2, '0')}.example`);
  const response = await provision({ sender_domains: domains });
  assert.equal(response.status, 201, response.text);
  assert.deepEqual(response.json.sender_domains, domains);
});

test('provision with a body that is not a JSON object answers 400 invalid_request', async () => {
  const bodies: [string, unknown][] = [
    ['invalid JSON', '{"sender_domains": ['],
    ['not JSON at all', 'sender_domains=example.com'],
    ['an array', '[]'],
    ['a string', '"{}"'],
    ['null', 'null'],
    ['a number', '1'],
    ['true', 'true'],
    ['an empty body', ''],
    ['a blank body', '  \n'],
  ];
  for (const [what, body] of bodies) {
    const details = expectError(await provision(body), 400, 'invalid_request');
    assert.equal(typeof details.field, 'string', what);
  }
  const missing = await h.api.post('/v1/inboxes');
  expectError(missing, 400, 'invalid_request');
});

test('provision with an unknown field answers 400 invalid_request with details.field naming it', async () => {
  for (const field of ['quota_bytes', 'lifetime_seconds', 'sender_domain', 'credentials', 'foo']) {
    const details = expectError(
      await provision({ sender_domains: ['example.com'], [field]: 1 }),
      400,
      'invalid_request',
    );
    assert.equal(details.field, field);
  }
});

test('provision with a query parameter answers 400 invalid_request naming it', async () => {
  const response = await h.api.post('/v1/inboxes?lifetime_seconds=7200', { body: {} });
  assert.equal(expectError(response, 400, 'invalid_request').field, 'lifetime_seconds');
});

test('provision naming an opted-out domain answers 409 sender_opted_out with details.field and details.domains', async () => {
  await h.optOuts.add('optedout-provision.example', h.clock.now());
  const response = await provision({
    sender_domains: ['fine.example', 'OptedOut-Provision.example'],
  });
  const details = expectError(response, 409, 'sender_opted_out');
  assert.equal(details.field, 'sender_domains');
  assert.deepEqual(details.domains, ['optedout-provision.example']);
});

test('provision naming a subdomain of an opted-out domain answers 409 sender_opted_out', async () => {
  await h.optOuts.add('optedout-parent.example', h.clock.now());
  const response = await provision({ sender_domains: ['mail.eu.optedout-parent.example'] });
  const details = expectError(response, 409, 'sender_opted_out');
  assert.deepEqual(details.domains, ['mail.eu.optedout-parent.example']);
});

test('provision naming the parent of an opted-out subdomain is accepted', async () => {
  await h.optOuts.add('news.parent-of-optout.example', h.clock.now());
  const response = await provision({ sender_domains: ['parent-of-optout.example'] });
  assert.equal(response.status, 201, response.text);
  assert.deepEqual(response.json.sender_domains, ['parent-of-optout.example']);
});

test('provision refused as sender_opted_out charges nothing: its Idempotency-Key stays unused', async () => {
  await h.optOuts.add('optedout-key.example', h.clock.now());
  const key = freshKey();
  const refused = await provision({ sender_domains: ['optedout-key.example'] }, { 'idempotency-key': key });
  expectError(refused, 409, 'sender_opted_out');
  const accepted = await provision({ sender_domains: ['other.example'] }, { 'idempotency-key': key });
  assert.equal(accepted.status, 201, accepted.text);
  assert.equal(accepted.headers.get('idempotent-replayed'), null);
});

test('provision with a malformed Idempotency-Key answers 400 invalid_request with details.field Idempotency-Key', async () => {
  const keys: [string, string][] = [
    ['a space', 'two words'],
    ['a tab', 'two\twords'],
    ['empty', ''],
    ['256 characters', 'k'.repeat(256)],
    ['non-ASCII (Latin-1 bytes)', 'clé-é'],
    ['non-ASCII (UTF-8 bytes)', Buffer.from('ключ', 'utf8').toString('latin1')],
  ];
  for (const [what, key] of keys) {
    const response = await provision({}, { 'idempotency-key': key });
    const details = expectError(response, 400, 'invalid_request');
    assert.equal(details.field, 'Idempotency-Key', what);
  }
});

test('provision accepts an Idempotency-Key of 1 and of 255 printable ASCII characters', async () => {
  const printable = Array.from({ length: 0x7e - 0x21 + 1 }, (_, i) => String.fromCharCode(0x21 + i)).join('');
  const unique = freshKey();
  const long = `${printable.repeat(3)}`.slice(0, 255 - unique.length) + unique;
  assert.equal(long.length, 255);
  for (const key of [long, '~']) {
    const first = await provision({}, { 'idempotency-key': key });
    assert.equal(first.status, 201, first.text);
    const again = await provision({}, { 'idempotency-key': key });
    assert.equal(again.status, 201, again.text);
    assert.equal(again.headers.get('idempotent-replayed'), 'true');
    assert.equal(again.json.inbox_id, first.json.inbox_id);
  }
});

test('provision replay with the same key and body returns the identical body, credentials included, with Idempotent-Replayed: true', async () => {
  const key = freshKey();
  const body = { sender_domains: ['replay.example'] };
  const first = await provision(body, { 'idempotency-key': key });
  assert.equal(first.status, 201, first.text);
  assert.equal(first.headers.get('idempotent-replayed'), null);
  h.clock.advance(30);
  const replay = await provision(body, { 'idempotency-key': key });
  assert.equal(replay.status, 201, replay.text);
  assert.equal(replay.headers.get('idempotent-replayed'), 'true');
  assert.deepEqual(replay.json, first.json);
  // The replay applies nothing: the inbox is the original one and its credentials still work.
  const status = await h.api.get(`/v1/inboxes/${first.json.inbox_id}`, {
    token: replay.json.credentials.owner,
  });
  assert.equal(status.status, 200, status.text);
  assert.equal(status.json.created_at, first.json.created_at);
});

test('provision replay returns the stored inbox even after one of its domains has since opted out', async () => {
  const key = freshKey();
  const body = { sender_domains: ['later-optout.example'] };
  const first = await provision(body, { 'idempotency-key': key });
  assert.equal(first.status, 201, first.text);
  await h.optOuts.add('later-optout.example', h.clock.now());
  const replay = await provision(body, { 'idempotency-key': key });
  assert.equal(replay.status, 201, replay.text);
  assert.equal(replay.headers.get('idempotent-replayed'), 'true');
  assert.deepEqual(replay.json, first.json);
  // Without the key the same body is a new, refused request.
  expectError(await provision(body), 409, 'sender_opted_out');
});

test('concurrent provisions with one key create one inbox and replay it to the others', async () => {
  const key = freshKey();
  const responses = await Promise.all(
    Array.from({ length: 6 }, () =>
      provision({ sender_domains: ['race.example'] }, { 'idempotency-key': key }),
    ),
  );
  for (const response of responses) assert.equal(response.status, 201, response.text);
  assert.equal(new Set(responses.map((r) => r.json.inbox_id)).size, 1);
  assert.equal(new Set(responses.map((r) => r.json.credentials.owner)).size, 1);
  assert.equal(responses.filter((r) => r.headers.get('idempotent-replayed') === null).length, 1);
});

test('provision replay after the inbox expired and was purged still returns the stored body', async () => {
  const key = freshKey();
  const first = await provision({}, { 'idempotency-key': key });
  assert.equal(first.status, 201, first.text);
  h.clock.advance(UNIT + h.config.purgeAfterSeconds + 60);
  const gone = await h.api.get(`/v1/inboxes/${first.json.inbox_id}`, { token: first.json.credentials.owner });
  expectError(gone, 401, 'unauthorized');
  const replay = await provision({}, { 'idempotency-key': key });
  assert.equal(replay.status, 201, replay.text);
  assert.equal(replay.headers.get('idempotent-replayed'), 'true');
  assert.deepEqual(replay.json, first.json);
});

test('provision reusing a key with a different body answers 409 idempotency_conflict with details.field Idempotency-Key', async () => {
  const key = freshKey();
  const first = await provision({ sender_domains: ['one.example'] }, { 'idempotency-key': key });
  assert.equal(first.status, 201, first.text);
  for (const body of [
    { sender_domains: ['two.example'] },
    {},
    { sender_domains: ['one.example', 'x.example'] },
  ]) {
    const conflict = await provision(body, { 'idempotency-key': key });
    const details = expectError(conflict, 409, 'idempotency_conflict');
    assert.equal(details.field, 'Idempotency-Key');
  }
  // The conflicts applied nothing: the key still replays the original.
  const replay = await provision({ sender_domains: ['one.example'] }, { 'idempotency-key': key });
  assert.deepEqual(replay.json, first.json);
});

test('provision with semantically equal bodies under one key is a replay (documented choice: the normalized list is compared)', async () => {
  const emptyKey = freshKey();
  const empty = await provision({}, { 'idempotency-key': emptyKey });
  const emptyAgain = await provision({ sender_domains: [] }, { 'idempotency-key': emptyKey });
  assert.equal(emptyAgain.status, 201, emptyAgain.text);
  assert.equal(emptyAgain.headers.get('idempotent-replayed'), 'true');
  assert.deepEqual(emptyAgain.json, empty.json);

  const listKey = freshKey();
  const list = await provision(
    { sender_domains: ['B.example.com', 'a.example.com'] },
    { 'idempotency-key': listKey },
  );
  const listAgain = await provision(
    { sender_domains: ['a.example.com', 'b.example.com.', 'A.Example.Com'] },
    { 'idempotency-key': listKey },
  );
  assert.equal(listAgain.status, 201, listAgain.text);
  assert.equal(listAgain.headers.get('idempotent-replayed'), 'true');
  assert.deepEqual(listAgain.json, list.json);
});

test('provision keys are case-sensitive: a key differing only in case provisions a new inbox', async () => {
  const key = `${freshKey()}-abc`;
  const first = await provision({}, { 'idempotency-key': key });
  const other = await provision({}, { 'idempotency-key': key.toUpperCase() });
  assert.equal(other.status, 201, other.text);
  assert.equal(other.headers.get('idempotent-replayed'), null);
  assert.notEqual(other.json.inbox_id, first.json.inbox_id);
});

test('provision without an Idempotency-Key provisions a new inbox on every call', async () => {
  const a = await provision({});
  const b = await provision({});
  assert.equal(b.headers.get('idempotent-replayed'), null);
  assert.notEqual(a.json.inbox_id, b.json.inbox_id);
});

test('provision key is remembered until IDEMPOTENCY_TTL_SECONDS, after which the same key provisions a new inbox', async () => {
  const ttl = h.config.idempotencyTtlSeconds;
  const key = freshKey();
  const first = await provision({ sender_domains: ['ttl.example'] }, { 'idempotency-key': key });
  assert.equal(first.status, 201, first.text);
  h.clock.advance(ttl - 1);
  const replay = await provision({ sender_domains: ['ttl.example'] }, { 'idempotency-key': key });
  assert.equal(replay.headers.get('idempotent-replayed'), 'true');
  assert.deepEqual(replay.json, first.json);
  h.clock.advance(2);
  const fresh = await provision({ sender_domains: ['ttl.example'] }, { 'idempotency-key': key });
  assert.equal(fresh.status, 201, fresh.text);
  assert.equal(fresh.headers.get('idempotent-replayed'), null);
  assert.notEqual(fresh.json.inbox_id, first.json.inbox_id);
  assert.notEqual(fresh.json.credentials.owner, first.json.credentials.owner);
  // From now on the key replays the new inbox.
  const again = await provision({ sender_domains: ['ttl.example'] }, { 'idempotency-key': key });
  assert.deepEqual(again.json, fresh.json);
});

test('provision key forgotten after IDEMPOTENCY_TTL_SECONDS may be used with a different body', async () => {
  const key = freshKey();
  const first = await provision({}, { 'idempotency-key': key });
  h.clock.advance(h.config.idempotencyTtlSeconds + 1);
  const other = await provision({ sender_domains: ['later.example'] }, { 'idempotency-key': key });
  assert.equal(other.status, 201, other.text);
  assert.notEqual(other.json.inbox_id, first.json.inbox_id);
  assert.deepEqual(other.json.sender_domains, ['later.example']);
});

test('the database holds neither credential nor the Idempotency-Key in plaintext, and no copy of the response', async () => {
  const key = `${freshKey()}-secret`;
  const response = await provision({ sender_domains: ['secret.example'] }, { 'idempotency-key': key });
  assert.equal(response.status, 201, response.text);
  const { owner, reader } = response.json.credentials;
  const hex = (s: string) => Buffer.from(s, 'utf8').toString('hex');
  const needles = [owner, reader, owner.slice(4), reader.slice(4), key];
  const forbidden = [...needles, ...needles.map(hex), Buffer.from(owner).toString('base64')];

  const client = new pg.Client({ connectionString: h.database.url });
  await client.connect();
  try {
    const tables = await client.query<{ table_name: string }>(
      `SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' AND table_type = 'BASE TABLE'`,
    );
    const names = tables.rows.map((r) => r.table_name);
    assert.ok(names.includes('credentials') && names.includes('provision_idempotency'), names.join(','));
    for (const table of names) {
      const rows = await client.query<{ row: string }>(
        `SELECT row_to_json(t)::text AS row FROM "${table}" t`,
      );
      for (const { row } of rows.rows) {
        for (const needle of forbidden) {
          assert.ok(
            !row.toLowerCase().includes(needle.toLowerCase()),
            `${table} holds a secret in plaintext`,
          );
        }
      }
    }
    // What is stored: two credential hashes for the inbox and one sealed replay record.
    const credentials = await client.query<{ credential_hash: Buffer; role: string }>(
      'SELECT credential_hash, role FROM credentials WHERE inbox_id = $1 ORDER BY role',
      [response.json.inbox_id],
    );
    assert.deepEqual(
      credentials.rows.map((r) => r.role),
      ['owner', 'reader'],
    );
    for (const { credential_hash } of credentials.rows) {
      assert.ok(
        !credential_hash.includes(Buffer.from(owner)) && !credential_hash.includes(Buffer.from(reader)),
      );
    }
    const sealed = await client.query<{ sealed_response: Buffer }>(
      'SELECT sealed_response FROM provision_idempotency',
    );
    assert.ok(sealed.rows.length > 0);
    const plaintext = Buffer.from(JSON.stringify(response.json));
    for (const { sealed_response } of sealed.rows) {
      assert.ok(!sealed_response.includes(Buffer.from(owner)));
      assert.ok(!sealed_response.includes(Buffer.from(reader)));
      assert.ok(!sealed_response.includes(plaintext));
    }
  } finally {
    await client.end();
  }
});

test('health answers 200 with ok true and the configured environment, without a credential', async () => {
  const response = await h.api.get('/v1/health');
  assert.equal(response.status, 200, response.text);
  assert.deepEqual(response.json, { ok: true, environment: 'dev' });
});

describe('while provisioning is closed', () => {
  let closed: Harness;
  before(async () => {
    closed = await startHarness({ PROVISIONING: 'closed', ENVIRONMENT: 'prod' });
  });
  after(() => closed.close());

  test('provision answers 401 unauthorized whatever the request', async () => {
    const requests: [unknown, Record<string, string>][] = [
      [{}, {}],
      [{ sender_domains: ['example.com'] }, { 'idempotency-key': freshKey() }],
      ['not json', {}],
      [{ quota_bytes: 1 }, {}],
      [{}, { 'idempotency-key': 'has space' }],
    ];
    const bodies = new Set<string>();
    for (const [body, headers] of requests) {
      const response = await closed.api.post('/v1/inboxes', { body, headers });
      expectError(response, 401, 'unauthorized');
      assert.equal(response.json.error.details, undefined);
      bodies.add(response.text);
    }
    assert.equal(bodies.size, 1);
  });

  test('provision with an inbox credential answers 401 unauthorized', async () => {
    const response = await closed.api.post('/v1/inboxes', { body: {}, token: `rmo_${'a'.repeat(32)}` });
    expectError(response, 401, 'unauthorized');
  });

  test('health reports ENVIRONMENT prod', async () => {
    const response = await closed.api.get('/v1/health');
    assert.equal(response.status, 200, response.text);
    assert.deepEqual(response.json, { ok: true, environment: 'prod' });
  });
});
