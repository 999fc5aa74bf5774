/**
 * The policy daemon's per-transaction grouping (DESIGN decision 3) follows Postfix's `instance`, not
 * the connection it arrives on: smtpd may close its policy connection between two RCPTs of one
 * transaction (smtpd_policy_service_max_ttl, or our disconnect on trouble) and ask the rest over a new
 * one. Until 2026-11-25 the new connection started an empty transaction, so a recipient with another
 * verdict joined the first one's transaction and the milter then deferred the whole message.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { TOKENS } from '../../src/container.ts';
import type { MessageStore, RecipientLookup } from '../../src/core/ports.ts';
import type { RecipientAdmission, RecipientRequest } from '../../src/core/recipient-admission.ts';
import type { Verdict } from '../../src/core/verdict.ts';
import { type Harness, startHarness } from '../support/harness.ts';
import { recipientAdmissionOver } from '../support/recipient-admission-over.ts';

let h: Harness;
let admission: RecipientAdmission;
before(async () => {
  h = await startHarness();
  admission = h.container.resolve<RecipientAdmission>(TOKENS.RecipientAdmission);
});
after(() => h.close());

const request = (instance: string, recipient: string): RecipientRequest => ({
  protocolState: 'RCPT',
  instance,
  clientAddress: '127.0.0.3',
  reverseClientName: 'mail.sender.test',
  sender: 'news@allowed.test',
  recipient,
  size: 0,
});

const shown = (v: Verdict) => (v.kind === 'accept' ? 'accept' : `${v.code} ${v.dsn}`);

test('a transaction continued over a new policy connection keeps its recipients', async () => {
  const open = await h.provision();
  const listed = await h.provision(['allowed.test']);
  const first = admission.connection();
  assert.equal(shown(await first.decide(request('6717.1.a.0', open.address))), 'accept');
  // smtpd recycles its policy connection; the same transaction goes on over another one.
  const second = admission.connection();
  assert.equal(shown(await second.decide(request('6717.1.a.0', listed.address))), '452 4.5.3');
  // Naming the first inbox again gets the verdict it got, recorded nowhere twice.
  assert.equal(shown(await second.decide(request('6717.1.a.0', open.address))), 'accept');
});

test('another transaction, on any connection, starts empty', async () => {
  const open = await h.provision();
  const listed = await h.provision(['allowed.test']);
  const first = admission.connection();
  assert.equal(shown(await first.decide(request('6717.2.a.0', open.address))), 'accept');
  assert.equal(shown(await admission.connection().decide(request('6717.2.b.0', listed.address))), 'accept');
  // The first connection's next transaction ends its first one.
  assert.equal(shown(await first.decide(request('6717.2.c.0', listed.address))), 'accept');
  assert.equal(shown(await admission.connection().decide(request('6717.2.a.0', listed.address))), 'accept');
});

test('requests without an instance are grouped per connection only', async () => {
  const open = await h.provision();
  const listed = await h.provision(['allowed.test']);
  const first = admission.connection();
  assert.equal(shown(await first.decide(request('', open.address))), 'accept');
  assert.equal(shown(await admission.connection().decide(request('', listed.address))), 'accept');
  assert.equal(shown(await first.decide(request('', listed.address))), '452 4.5.3');
});

test('an RCPT asked again while its decision is still being made (Postfix gave up waiting) gets that decision, recorded once', async () => {
  const inbox = await h.provision();
  await h.optOuts.add('retried-optout.test', h.clock.now());
  let recorded = 0;
  let release: () => void = () => {};
  const held = new Promise<void>((resolve) => {
    release = resolve;
  });
  const slow = new Proxy(h.messages, {
    get(target, key) {
      if (key === 'recordRejection')
        return async (...args: Parameters<MessageStore['recordRejection']>) => {
          recorded++;
          await held;
          return target.recordRejection(...args);
        };
      const value = Reflect.get(target, key);
      return typeof value === 'function' ? value.bind(target) : value;
    },
  });
  const retrying = recipientAdmissionOver(h, { messages: slow });
  const ask = { ...request('6717.9.a.0', inbox.address), sender: 'news@retried-optout.test' };
  const first = retrying.connection().decide(ask);
  for (let waited = 0; recorded === 0; waited += 5) {
    assert.ok(waited < 5_000, 'the refusal is being recorded');
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
  // Postfix's policy client timed out; the same RCPT of the same transaction comes on a new connection.
  const again = retrying.connection().decide(ask);
  release();
  assert.deepEqual([shown(await first), shown(await again)], ['555 5.7.1', '555 5.7.1']);
  assert.equal(recorded, 1, 'one refusal, recorded once');
});

test('a retried RCPT whose first decision then fails decides afresh', async () => {
  const inbox = await h.provision();
  const lookup = h.container.resolve<RecipientLookup>(TOKENS.RecipientLookup);
  let calls = 0;
  let fail: (error: Error) => void = () => {};
  let asked: () => void = () => {};
  const firstAsked = new Promise<void>((resolve) => {
    asked = resolve;
  });
  const flaky: RecipientLookup = {
    find: (...args) => {
      calls++;
      if (calls > 1) return lookup.find(...args);
      asked();
      return new Promise((_, reject) => {
        fail = reject;
      });
    },
  };
  const retrying = recipientAdmissionOver(h, { lookup: flaky });
  const ask = request('6717.10.a.0', inbox.address);
  const first = retrying.connection().decide(ask);
  first.catch(() => {});
  await firstAsked;
  const again = retrying.connection().decide(ask);
  fail(new Error('Connection terminated unexpectedly'));
  await assert.rejects(first, /Connection terminated/);
  assert.equal(shown(await again), 'accept');
  assert.equal(calls, 2);
});
