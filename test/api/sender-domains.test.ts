/**
 * sender-domains - PUT /v1/inboxes/{id}/sender-domains (contract sections 2, 4 and 7): the list
 * replaces the current one, the entry rules, opt-outs, and the error table.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { TOKENS } from '../../src/container.ts';
import type { InboxService, ProvisionedInbox } from '../../src/core/inbox-service.ts';
import { expectError, INVALID_SENDER_DOMAINS, VALID_SENDER_DOMAINS } from '../support/assertions.ts';
import { duringCancel } from '../support/cancel-race.ts';
import { type ApiResponse, type Harness, startHarness } from '../support/harness.ts';

let h: Harness;
before(async () => {
  h = await startHarness();
});
after(() => h.close());

function put(inbox: ProvisionedInbox, body: unknown, token = inbox.credentials.owner): Promise<ApiResponse> {
  return h.api.put(`/v1/inboxes/${inbox.inbox_id}/sender-domains`, { token, body });
}

async function listOf(inbox: ProvisionedInbox): Promise<string[]> {
  const status = await h.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.reader });
  assert.equal(status.status, 200, status.text);
  return status.json.sender_domains;
}

test('set sender domains replaces the list and answers 200 with the inbox status', async () => {
  const inbox = await h.provision(['old.example']);
  const response = await put(inbox, { sender_domains: ['new.example', 'other.example'] });
  assert.equal(response.status, 200, response.text);
  assert.equal(response.json.inbox_id, inbox.inbox_id);
  assert.equal(response.json.state, 'live');
  assert.equal(response.json.expires_at, inbox.expires_at);
  assert.equal(response.json.quota_bytes, inbox.quota_bytes);
  assert.deepEqual(response.json.sender_domains, ['new.example', 'other.example']);
  assert.deepEqual(await listOf(inbox), ['new.example', 'other.example']);
});

test('set sender domains stores entries lowercased, deduplicated and sorted', async () => {
  const inbox = await h.provision();
  const response = await put(inbox, {
    sender_domains: ['Zeta.example', 'b.example.com', 'A.EXAMPLE.COM', 'B.Example.Com.', 'a.example.com'],
  });
  assert.equal(response.status, 200, response.text);
  assert.deepEqual(response.json.sender_domains, ['a.example.com', 'b.example.com', 'zeta.example']);
  assert.deepEqual(await listOf(inbox), ['a.example.com', 'b.example.com', 'zeta.example']);
});

test('set sender domains with [] takes mail from anyone', async () => {
  const inbox = await h.provision(['only.example']);
  const response = await put(inbox, { sender_domains: [] });
  assert.equal(response.status, 200, response.text);
  assert.deepEqual(response.json.sender_domains, []);
  assert.deepEqual(await listOf(inbox), []);
});

test('set sender domains repeated with the same list is harmless', async () => {
  const inbox = await h.provision();
  const first = await put(inbox, { sender_domains: ['same.example'] });
  const second = await put(inbox, { sender_domains: ['same.example'] });
  assert.equal(second.status, 200, second.text);
  assert.deepEqual(second.json, first.json);
});

test('set sender domains accepts every domain name form of section 2', async () => {
  const inbox = await h.provision();
  for (const [sent, stored] of VALID_SENDER_DOMAINS) {
    const response = await put(inbox, { sender_domains: [sent] });
    assert.equal(response.status, 200, `${JSON.stringify(sent)}: ${response.text}`);
    assert.deepEqual(response.json.sender_domains, [stored], JSON.stringify(sent));
  }
});

test('set sender domains with an entry that is not a domain name answers 400 invalid_request with details.field; the list is unchanged', async () => {
  const inbox = await h.provision(['kept.example']);
  for (const entry of INVALID_SENDER_DOMAINS) {
    const response = await put(inbox, { sender_domains: ['fine.example', entry] });
    const details = expectError(response, 400, 'invalid_request');
    assert.match(String(details.field), /^sender_domains/, JSON.stringify(entry));
  }
  assert.deepEqual(await listOf(inbox), ['kept.example']);
});

test('an entry nested thousands of arrays deep answers 400 invalid_request, and 401 first without a credential', async () => {
  const inbox = await h.provision(['kept.example']);
  const body = `{"sender_domains":[${'['.repeat(5000)}${']'.repeat(5000)}]}`;
  const path = `/v1/inboxes/${inbox.inbox_id}/sender-domains`;
  const response = await h.api.put(path, { token: inbox.credentials.owner, body });
  assert.equal(expectError(response, 400, 'invalid_request').field, 'sender_domains');
  expectError(await h.api.put(path, { body }), 401, 'unauthorized');
  assert.deepEqual(await listOf(inbox), ['kept.example']);
});

test('set sender domains waiting on a cancel that commits first answers 410 inbox_cancelled; the list is unchanged', async () => {
  const inbox = await h.provision(['kept.example']);
  const cancelledAt = h.clock.now();
  const response = await duringCancel(h.database.url, inbox.inbox_id, cancelledAt, () =>
    put(inbox, { sender_domains: ['new.example'] }),
  );
  assert.deepEqual(expectError(response, 410, 'inbox_cancelled'), {
    reason: 'abuse',
    cancelled_at: cancelledAt.toISOString(),
  });
  assert.deepEqual((await h.inboxes.find(inbox.inbox_id))?.senderDomains, ['kept.example']);
});

test('set sender domains with a body that is not a JSON object answers 400 invalid_request', async () => {
  const inbox = await h.provision(['kept.example']);
  for (const body of [
    '{"sender_domains": [',
    'sender_domains=a.example',
    '[]',
    '["a.example"]',
    '"x"',
    'null',
    '7',
    '',
  ]) {
    const details = expectError(await put(inbox, body), 400, 'invalid_request');
    assert.equal(typeof details.field, 'string', body);
  }
  const missing = await h.api.put(`/v1/inboxes/${inbox.inbox_id}/sender-domains`, {
    token: inbox.credentials.owner,
  });
  expectError(missing, 400, 'invalid_request');
  assert.deepEqual(await listOf(inbox), ['kept.example']);
});

test('set sender domains without sender_domains answers 400 invalid_request naming sender_domains', async () => {
  const inbox = await h.provision(['kept.example']);
  const details = expectError(await put(inbox, {}), 400, 'invalid_request');
  assert.equal(details.field, 'sender_domains');
  for (const value of [null, 'a.example', { a: 1 }]) {
    const wrongType = expectError(await put(inbox, { sender_domains: value }), 400, 'invalid_request');
    assert.equal(wrongType.field, 'sender_domains', JSON.stringify(value));
  }
  assert.deepEqual(await listOf(inbox), ['kept.example']);
});

test('set sender domains with an unknown field answers 400 invalid_request with details.field naming it', async () => {
  const inbox = await h.provision();
  for (const field of ['mode', 'add', 'sender_domain']) {
    const details = expectError(
      await put(inbox, { sender_domains: ['a.example'], [field]: true }),
      400,
      'invalid_request',
    );
    assert.equal(details.field, field);
  }
  assert.deepEqual(await listOf(inbox), []);
});

test('set sender domains with more than 20 domains answers 400 out_of_bounds (details.got is the count sent)', async () => {
  const inbox = await h.provision(['kept.example']);
  const distinct = Array.from({ length: 21 }, (_, i) => `d${i}.example`);
  const details = expectError(await put(inbox, { sender_domains: distinct }), 400, 'out_of_bounds');
  assert.equal(details.field, 'sender_domains');
  assert.equal(typeof details.min, 'number');
  assert.equal(details.max, 20);
  assert.equal(details.got, 21);
  const repeated = Array.from({ length: 30 }, () => 'same.example');
  assert.equal(expectError(await put(inbox, { sender_domains: repeated }), 400, 'out_of_bounds').got, 30);
  assert.deepEqual(await listOf(inbox), ['kept.example']);
  const twenty = await put(inbox, { sender_domains: distinct.slice(0, 20) });
  assert.equal(twenty.status, 200, twenty.text);
  assert.equal(twenty.json.sender_domains.length, 20);
});

test('set sender domains with a credential problem answers 401 unauthorized', async () => {
  const inbox = await h.provision(['kept.example']);
  const other = await h.provision();
  for (const token of [
    undefined,
    'xyz',
    `rmo_${'1'.repeat(32)}`,
    other.credentials.owner,
    other.credentials.reader,
  ]) {
    const response = await h.api.put(`/v1/inboxes/${inbox.inbox_id}/sender-domains`, {
      body: { sender_domains: ['evil.example'] },
      ...(token ? { token } : {}),
    });
    expectError(response, 401, 'unauthorized');
  }
  assert.deepEqual(await listOf(inbox), ['kept.example']);
  assert.deepEqual(await listOf(other), []);
});

test('set sender domains with the reader credential answers 403 forbidden', async () => {
  const inbox = await h.provision(['kept.example']);
  const response = await put(inbox, { sender_domains: ['other.example'] }, inbox.credentials.reader);
  expectError(response, 403, 'forbidden');
  assert.equal(response.json.error.details, undefined);
  assert.deepEqual(await listOf(inbox), ['kept.example']);
});

test('set sender domains after expires_at has passed answers 409 inbox_expired', async () => {
  const inbox = await h.provision(['kept.example']);
  h.clock.advance(3600);
  assert.equal(h.clock.now().toISOString(), inbox.expires_at);
  const response = await put(inbox, { sender_domains: ['other.example'] });
  expectError(response, 409, 'inbox_expired');
  assert.equal(response.json.error.details, undefined);
  assert.deepEqual(await listOf(inbox), ['kept.example']);
});

test('set sender domains naming an opted-out domain answers 409 sender_opted_out with details.domains; the list is unchanged', async () => {
  await h.optOuts.add('optedout-put.example', h.clock.now());
  const inbox = await h.provision(['kept.example']);
  const response = await put(inbox, { sender_domains: ['fine.example', 'OPTEDOUT-PUT.example.'] });
  const details = expectError(response, 409, 'sender_opted_out');
  assert.equal(details.field, 'sender_domains');
  assert.deepEqual(details.domains, ['optedout-put.example']);
  assert.deepEqual(await listOf(inbox), ['kept.example']);
});

test('set sender domains lists every refused entry in details.domains', async () => {
  await h.optOuts.add('optedout-one.example', h.clock.now());
  await h.optOuts.add('optedout-two.example', h.clock.now());
  const inbox = await h.provision();
  const response = await put(inbox, {
    sender_domains: ['mail.optedout-two.example', 'fine.example', 'optedout-one.example'],
  });
  const details = expectError(response, 409, 'sender_opted_out');
  assert.deepEqual([...(details.domains as string[])].sort(), [
    'mail.optedout-two.example',
    'optedout-one.example',
  ]);
});

test('set sender domains naming a subdomain of an opted-out domain answers 409 sender_opted_out', async () => {
  await h.optOuts.add('optedout-sub.example', h.clock.now());
  const inbox = await h.provision();
  const details = expectError(
    await put(inbox, { sender_domains: ['a.b.optedout-sub.example'] }),
    409,
    'sender_opted_out',
  );
  assert.deepEqual(details.domains, ['a.b.optedout-sub.example']);
});

test('set sender domains naming the parent of an opted-out subdomain is accepted', async () => {
  await h.optOuts.add('marketing.parent-put.example', h.clock.now());
  const inbox = await h.provision();
  const response = await put(inbox, { sender_domains: ['parent-put.example', 'other.parent-put.example'] });
  assert.equal(response.status, 200, response.text);
  assert.deepEqual(response.json.sender_domains, ['other.parent-put.example', 'parent-put.example']);
});

test('set sender domains on a cancelled inbox answers 410 inbox_cancelled', async () => {
  const inbox = await h.provision(['kept.example']);
  const cancelledAt = h.clock.now();
  await h.container.resolve<InboxService>(TOKENS.InboxService).cancel(inbox.inbox_id);
  for (const token of [inbox.credentials.owner, inbox.credentials.reader]) {
    const details = expectError(await put(inbox, { sender_domains: [] }, token), 410, 'inbox_cancelled');
    assert.equal(details.reason, 'abuse');
    assert.equal(details.cancelled_at, cancelledAt.toISOString());
  }
});

test('set sender domains with a query parameter answers 400 invalid_request naming it', async () => {
  const inbox = await h.provision();
  const response = await h.api.put(`/v1/inboxes/${inbox.inbox_id}/sender-domains?append=1`, {
    token: inbox.credentials.owner,
    body: { sender_domains: ['a.example'] },
  });
  assert.equal(expectError(response, 400, 'invalid_request').field, 'append');
  assert.deepEqual(await listOf(inbox), []);
});
