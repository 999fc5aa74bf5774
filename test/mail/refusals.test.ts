/**
 * Every refusal of DESIGN decision 2 through the real Postfix: the literal reply the sender sees, the
 * stage it comes at (RCPT rows: the RCPT reply is the refusal and no DATA follows; end-of-data rows:
 * RCPT 250, DATA 354, the refusal after the final dot), and what is recorded (contract section 2
 * "Rejection event", section 3 "Rejection record", section 4 "Receiving mail"). Nothing refused is
 * ever stored.
 *
 * The file's main stack has QUOTA_BYTES 10000 so quota refusals need no large mail, and MAX_REJECTIONS 3
 * so the cap is cheap to reach; MAX_MESSAGE_BYTES keeps the contract's 25 MiB. A second stack, in the
 * last `describe`, keeps the contract's quota for transactions with several recipients (DESIGN decision
 * 3) and for inboxes closing between RCPT and end of data. optout.test is opted out in both. The clock
 * only moves forward, so every test provisions its own inboxes.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { newInboxId } from '../../src/core/ids.ts';
import type { ProvisionedInbox } from '../../src/core/inbox-service.ts';
import { iso } from '../support/assertions.ts';
import { dkimSignFor } from '../support/dns-zone.ts';
import { type MailStack, plainMessage, startMailStack } from '../support/mail-stack.ts';
import { SmtpClient, type TransactionReplies } from '../support/smtp-client.ts';

const QUOTA = 10_000;
const MAX_REJECTIONS = 3;
const MAX_MESSAGE_BYTES = 25 * 1024 * 1024;
/** Postfix's own limit: MAX_MESSAGE_BYTES plus src/postfix/render.ts's MESSAGE_SIZE_SLACK. */
const POSTFIX_SIZE_LIMIT = MAX_MESSAGE_BYTES + 65536;

let s: MailStack;
before(async () => {
  s = await startMailStack({ env: { QUOTA_BYTES: String(QUOTA), MAX_REJECTIONS: String(MAX_REJECTIONS) } });
  await s.optOuts.add('optout.test', s.clock.now());
});
after(() => s?.close());

// --- what a sender sees ------------------------------------------------------------------------------

const MAIL_OK = '250 2.1.0 Ok';
const RCPT_OK = '250 2.1.5 Ok';
const DATA_GO = '354 End data with <CR><LF>.<CR><LF>';

/** The reply Postfix gives for a policy daemon's RCPT refusal: its prefix, then our text verbatim. */
const atRcpt = (address: string, reply: string): string => {
  const [code, dsn, ...text] = reply.split(' ');
  return `${code} ${dsn} <${address}>: Recipient address rejected: ${text.join(' ')}`;
};

/** Refused at RCPT: MAIL was taken, the RCPT replies are `expected`, and the client never reached DATA. */
function assertRefusedAtRcpt(replies: TransactionReplies, expected: string[]): void {
  assert.equal(replies.greeting.code, 220, replies.greeting.text);
  assert.equal(replies.mail?.text, MAIL_OK);
  assert.deepEqual(
    replies.rcpt.map((r) => r.text),
    expected,
  );
  assert.equal(replies.data, undefined, 'no DATA after a refused RCPT');
  assert.equal(replies.end, undefined);
}

/** Refused at end of data: RCPT 250, DATA 354, and the reply after the final dot is `expected`. */
function assertRefusedAtEom(replies: TransactionReplies, expected: string): void {
  assert.equal(replies.greeting.code, 220, replies.greeting.text);
  assert.equal(replies.mail?.text, MAIL_OK);
  assert.deepEqual(
    replies.rcpt.map((r) => r.text),
    [RCPT_OK],
  );
  assert.equal(replies.data?.text, DATA_GO);
  assert.equal(replies.end?.text, expected);
}

// --- what the inbox shows ----------------------------------------------------------------------------

async function poll(inbox: ProvisionedInbox) {
  const response = await s.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, {
    token: inbox.credentials.owner,
  });
  assert.equal(response.status, 200, response.text);
  return response.json;
}

async function rejectionCount(inbox: ProvisionedInbox): Promise<number> {
  const response = await s.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.owner });
  assert.equal(response.status, 200, response.text);
  return response.json.rejection_count;
}

/** Counts read from the store, for inboxes the API no longer shows (cancelled, purged). */
async function stored(inboxId: string): Promise<{ rejectionCount: number; messageCount: number }> {
  const now = s.clock.now();
  const target = await s.inboxes.findForDelivery(inboxId, now);
  assert.ok(target, `inbox ${inboxId} is still in the database`);
  const usage = await s.inboxes.usage(inboxId, now);
  return { rejectionCount: target.inbox.rejectionCount, messageCount: usage.messageCount };
}

/**
 * Live inboxes that refused mail, with the Message-IDs they may list (mail they accepted on purpose):
 * checked again once Postfix's queue is empty, so a refused message delivered late would show.
 */
const refusedIn = new Map<ProvisionedInbox, string[]>();

/** Asserts poll lists no message and exactly `rejections`, and that rejection_count is `count`. */
async function assertRecorded(
  inbox: ProvisionedInbox,
  rejections: Record<string, unknown>[],
  count = rejections.length,
): Promise<void> {
  const body = await poll(inbox);
  assert.deepEqual(body.messages, [], 'nothing refused is stored');
  assert.deepEqual(body.rejections, rejections);
  assert.equal(body.inbox.rejection_count, count);
  assert.equal(body.inbox.message_count, 0);
  assert.equal(body.inbox.quota_used_bytes, 0);
  if (body.inbox.state === 'live') refusedIn.set(inbox, []);
}

/** A plain message of exactly `total` bytes as sent, its body lines at most 78 bytes. */
function messageOfSize(total: number, given: Parameters<typeof plainMessage>[0]): Buffer {
  const fields = { messageId: `<size-${total}@allowed.test>`, ...given };
  const bare = plainMessage({ ...fields, body: '' }).length;
  const room = total - bare;
  assert.ok(room >= 0, `a ${total}-byte message has room for its header`);
  const line = `${'x'.repeat(76)}\r\n`;
  const body = line.repeat(Math.floor(room / line.length)) + 'y'.repeat(room % line.length);
  const message = plainMessage({ ...fields, body });
  assert.equal(message.length, total);
  return message;
}

// --- RCPT: the policy daemon -------------------------------------------------------------------------

test('mail to an address that names no inbox is refused at RCPT with 555 5.7.1 no such inbox, and DATA finds no valid recipient', async () => {
  const unknown = `${newInboxId()}@svc.test`;
  const malformed = ['not-an-inbox@svc.test', `${'u'.repeat(20)}@svc.test`, `${newInboxId()}x@svc.test`];
  const { client, greeting } = await SmtpClient.open(s.smtpPort, { localAddress: '127.0.0.3' });
  try {
    assert.equal(greeting.text, '220 mx.svc.test ESMTP');
    assert.equal((await client.command('EHLO mail.sender.test')).code, 250);
    assert.equal((await client.command('MAIL FROM:<sender@allowed.test>')).text, MAIL_OK);
    for (const address of [unknown, ...malformed]) {
      assert.equal(
        (await client.command(`RCPT TO:<${address}>`)).text,
        atRcpt(address, '555 5.7.1 svc.test: no such inbox'),
      );
    }
    const { start, end } = await client.data(plainMessage({ to: unknown }));
    assert.equal(start.text, '554 5.5.1 Error: no valid recipients');
    assert.equal(end, undefined);
  } finally {
    await client.quit();
  }
});

test('mail to an inbox past expires_at is refused at RCPT with 555 5.7.1 inbox expired and not recorded', async () => {
  const inbox = await s.provision();
  s.clock.advance(s.config.unitSeconds);
  const replies = await s.send({ to: [inbox.address], message: plainMessage({ to: inbox.address }) });
  assertRefusedAtRcpt(replies, [atRcpt(inbox.address, '555 5.7.1 svc.test: inbox expired')]);
  const body = await poll(inbox);
  assert.equal(body.inbox.state, 'expired');
  await assertRecorded(inbox, []);
});

test('mail to an inbox purged after expiry is refused at RCPT with 555 5.7.1 no such inbox and not recorded', async () => {
  const inbox = await s.provision();
  s.clock.advance(s.config.unitSeconds + s.config.purgeAfterSeconds);
  const replies = await s.send({ to: [inbox.address], message: plainMessage({ to: inbox.address }) });
  assertRefusedAtRcpt(replies, [atRcpt(inbox.address, '555 5.7.1 svc.test: no such inbox')]);
  const status = await s.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.owner });
  assert.equal(status.status, 401);
  assert.deepEqual(await stored(inbox.inbox_id), { rejectionCount: 0, messageCount: 0 });
});

test('mail to an inbox cancelled for abuse is refused at RCPT with the abuse contact and not recorded', async () => {
  const inbox = await s.provision();
  await s.inboxes.cancel(inbox.inbox_id, s.clock.now());
  const replies = await s.send({ to: [inbox.address], message: plainMessage({ to: inbox.address }) });
  assertRefusedAtRcpt(replies, [
    atRcpt(inbox.address, '555 5.7.1 svc.test: address disabled for abuse; reports: abuse@svc.test'),
  ]);
  const status = await s.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.owner });
  assert.equal(status.status, 410);
  assert.deepEqual(await stored(inbox.inbox_id), { rejectionCount: 0, messageCount: 0 });
});

test('mail to an inbox cancelled and past its paid lifetime (purged) is refused at RCPT with 555 5.7.1 no such inbox and not recorded', async () => {
  const inbox = await s.provision();
  await s.inboxes.cancel(inbox.inbox_id, s.clock.now());
  s.clock.advance(s.config.unitSeconds);
  const replies = await s.send({ to: [inbox.address], message: plainMessage({ to: inbox.address }) });
  assertRefusedAtRcpt(replies, [atRcpt(inbox.address, '555 5.7.1 svc.test: no such inbox')]);
  const status = await s.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.owner });
  assert.equal(status.status, 401);
  assert.deepEqual(await stored(inbox.inbox_id), { rejectionCount: 0, messageCount: 0 });
});

test('changes to an inbox that already took mail apply from the next RCPT: extended, sender opted out, cancelled', async () => {
  // The policy daemon keeps what RCPT read of the inbox and the opt-outs (storage/recipient-lookup.ts):
  // each change must reach it, or the next RCPT would be decided on what it kept. A change reaches it a
  // moment after its commit (an announcement); s.announced() waits for that moment, which a session
  // opened at once could otherwise beat (it did, once in CI).
  const inbox = await s.provision();
  const from = 'news@later-optout.test';
  const send = () =>
    s.send({ from, to: [inbox.address], message: plainMessage({ to: inbox.address, from }) });
  const assertAccepted = (replies: TransactionReplies) => {
    assert.deepEqual(
      replies.rcpt.map((r) => r.text),
      [RCPT_OK],
    );
    assert.match(replies.end?.text ?? '', /^250 2\.0\.0 Ok: queued as \w+$/);
  };
  assertAccepted(await send());

  const extended = await s.api.post(`/v1/inboxes/${inbox.inbox_id}/extend`, {
    token: inbox.credentials.owner,
  });
  assert.equal(extended.status, 200, extended.text);
  s.clock.advance(s.config.unitSeconds); // past the first expiry, before the extended one
  await s.announced();
  assertAccepted(await send());

  await s.optOuts.add('later-optout.test', s.clock.now());
  await s.announced();
  assertRefusedAtRcpt(await send(), [atRcpt(inbox.address, '555 5.7.1 svc.test: sender domain opted out')]);

  await s.inboxes.cancel(inbox.inbox_id, s.clock.now());
  await s.announced();
  const cancelled = await s.send({ to: [inbox.address], message: plainMessage({ to: inbox.address }) });
  assertRefusedAtRcpt(cancelled, [
    atRcpt(inbox.address, '555 5.7.1 svc.test: address disabled for abuse; reports: abuse@svc.test'),
  ]);
});

test('an envelope sender whose domain opted out is refused at RCPT and recorded as sender_opted_out naming the opted-out domain', async () => {
  const inbox = await s.provision();
  const at = iso(s.clock.now());
  const refusal = atRcpt(inbox.address, '555 5.7.1 svc.test: sender domain opted out');
  const direct = await s.send({
    from: 'news@optout.test',
    to: [inbox.address],
    message: plainMessage({ to: inbox.address, from: 'news@optout.test' }),
  });
  assertRefusedAtRcpt(direct, [refusal]);
  const sub = await s.send({
    from: 'x@sub.optout.test',
    to: [inbox.address],
    mailParams: 'SIZE=1234',
    message: plainMessage({ to: inbox.address, from: 'x@sub.optout.test' }),
  });
  assertRefusedAtRcpt(sub, [refusal]);
  await assertRecorded(inbox, [
    {
      at,
      envelope_from: 'news@optout.test',
      reason: 'sender_opted_out',
      sender_domain: 'optout.test',
      size_bytes: 0,
    },
    {
      at,
      envelope_from: 'x@sub.optout.test',
      reason: 'sender_opted_out',
      sender_domain: 'optout.test',
      size_bytes: 1234,
    },
  ]);
});

test('an SMTPUTF8 envelope sender whose domain, written in Unicode, opted out (as its xn-- name) is refused at RCPT', async () => {
  await s.optOuts.add('xn--bcher-kva.test', s.clock.now());
  const inbox = await s.provision();
  const at = iso(s.clock.now());
  const replies = await s.send({
    from: 'news@bücher.test',
    to: [inbox.address],
    mailParams: 'SMTPUTF8',
    message: plainMessage({ to: inbox.address, from: 'news@lax.test' }),
  });
  assertRefusedAtRcpt(replies, [atRcpt(inbox.address, '555 5.7.1 svc.test: sender domain opted out')]);
  await assertRecorded(inbox, [
    {
      at,
      envelope_from: 'news@bücher.test',
      reason: 'sender_opted_out',
      sender_domain: 'xn--bcher-kva.test',
      size_bytes: 0,
    },
  ]);
});

test('a declared SIZE= larger than the free quota is refused at RCPT with 555 5.7.1 mailbox quota exceeded and recorded as quota', async () => {
  const inbox = await s.provision();
  const at = iso(s.clock.now());
  const replies = await s.send({
    from: 'big@allowed.test',
    to: [inbox.address],
    mailParams: `SIZE=${QUOTA + 1}`,
    message: plainMessage({ to: inbox.address }),
  });
  assertRefusedAtRcpt(replies, [atRcpt(inbox.address, '555 5.7.1 svc.test: mailbox quota exceeded')]);
  await assertRecorded(inbox, [
    { at, envelope_from: 'big@allowed.test', reason: 'quota', sender_domain: null, size_bytes: QUOTA + 1 },
  ]);
});

test('a declared SIZE= equal to the free quota passes RCPT', async () => {
  const inbox = await s.provision();
  const replies = await s.send({
    to: [inbox.address],
    mailParams: `SIZE=${QUOTA}`,
    message: plainMessage({ to: inbox.address }),
  });
  assert.deepEqual(
    replies.rcpt.map((r) => r.text),
    [RCPT_OK],
  );
  assert.match(replies.end?.text ?? '', /^250 2\.0\.0 Ok: queued as \w+$/);
  assert.equal(await rejectionCount(inbox), 0);
});

test('a further recipient whose inbox could run out of quota before end of data gets 452 4.5.3 for a separate transaction', async () => {
  // Both inboxes take any sender, but with 10000-byte quotas a message could fit one and not the other.
  const first = await s.provision();
  const second = await s.provision();
  const replies = await s.send({
    to: [first.address, second.address],
    message: plainMessage({ to: first.address }),
  });
  assert.deepEqual(
    replies.rcpt.map((r) => r.text),
    [RCPT_OK, atRcpt(second.address, '452 4.5.3 svc.test: send this recipient in a separate transaction')],
  );
  assert.match(replies.end?.text ?? '', /^250 2\.0\.0 Ok: queued as \w+$/);
  assert.equal(await rejectionCount(second), 0, 'a 452 is not a rejection');
});

// --- end of data: Postfix's size limit and the milter -----------------------------------------------

test("a message one byte over 25 MiB gets the milter's 552 5.3.4 at end of data and is not recorded", async () => {
  const inbox = await s.provision();
  const message = messageOfSize(MAX_MESSAGE_BYTES + 1, { to: inbox.address });
  const replies = await s.send({ to: [inbox.address], message });
  assertRefusedAtEom(replies, '552 5.3.4 Message size exceeds fixed maximum message size');
  await assertRecorded(inbox, []);
});

test("a message of exactly 25 MiB passes the size limit (and is then over this inbox's quota)", async () => {
  const inbox = await s.provision();
  const at = iso(s.clock.now());
  const message = messageOfSize(MAX_MESSAGE_BYTES, { to: inbox.address });
  const replies = await s.send({ to: [inbox.address], message });
  assertRefusedAtEom(replies, '555 5.7.1 svc.test: mailbox quota exceeded');
  await assertRecorded(inbox, [
    {
      at,
      envelope_from: 'sender@allowed.test',
      reason: 'quota',
      sender_domain: 'allowed.test',
      size_bytes: MAX_MESSAGE_BYTES,
    },
  ]);
});

test("a message over Postfix's message_size_limit gets Postfix's 552 5.3.4 at end of data and is not recorded", async () => {
  const inbox = await s.provision();
  const message = messageOfSize(POSTFIX_SIZE_LIMIT + 1000, { to: inbox.address });
  const replies = await s.send({ to: [inbox.address], message });
  assertRefusedAtEom(replies, '552 5.3.4 Error: message file too big');
  await assertRecorded(inbox, []);
});

test("a declared SIZE= over Postfix's message_size_limit is refused at MAIL with Postfix's 552 5.3.4, before any RCPT, and not recorded", async () => {
  const inbox = await s.provision();
  const replies = await s.send({
    to: [inbox.address],
    mailParams: `SIZE=${POSTFIX_SIZE_LIMIT + 1}`,
    message: plainMessage({ to: inbox.address }),
  });
  assert.equal(replies.mail?.text, '552 5.3.4 Message size exceeds fixed limit');
  assert.deepEqual(replies.rcpt, []);
  assert.equal(replies.data, undefined);
  await assertRecorded(inbox, []);
});

test("a declared SIZE= over 25 MiB but within Postfix's limit passes RCPT, though over the free quota too, and the message gets 552 5.3.4 at end of data, not recorded", async () => {
  const inbox = await s.provision();
  const message = messageOfSize(MAX_MESSAGE_BYTES + 1, { to: inbox.address });
  const replies = await s.send({ to: [inbox.address], mailParams: `SIZE=${message.length}`, message });
  assertRefusedAtEom(replies, '552 5.3.4 Message size exceeds fixed maximum message size');
  await assertRecorded(inbox, []);
});

test('mail failing DMARC for a p=reject domain gets 550 5.7.1 DMARC checks failed at end of data, nothing recorded', async () => {
  const inbox = await s.provision();
  const replies = await s.send({
    from: 'sender@strict.test',
    to: [inbox.address],
    message: plainMessage({ to: inbox.address, from: 'Sender <sender@strict.test>' }),
  });
  assertRefusedAtEom(replies, '550 5.7.1 DMARC checks failed');
  await assertRecorded(inbox, []);
});

test('a From: naming several domains is checked for each: one failing DMARC under p=reject gets 550, one opted out gets 555 (recorded), and neither gets through', async () => {
  const inbox = await s.provision();
  const mixed = plainMessage({ to: inbox.address, from: 'ceo@strict.test, x@lax.test' });
  assertRefusedAtEom(
    await s.send({ from: 'ceo@strict.test', to: [inbox.address], message: mixed }),
    '550 5.7.1 DMARC checks failed',
  );
  const twoFields = plainMessage({
    to: inbox.address,
    from: 'x@lax.test',
    extraHeaders: ['From: ceo@strict.test'],
  });
  assertRefusedAtEom(
    await s.send({ from: 'ceo@strict.test', to: [inbox.address], message: twoFields }),
    '550 5.7.1 DMARC checks failed',
  );
  const optedOut = plainMessage({ to: inbox.address, from: 'news@optout.test, x@lax.test' });
  assertRefusedAtEom(
    await s.send({ from: 'bounce@lax.test', to: [inbox.address], message: optedOut }),
    '555 5.7.1 svc.test: sender domain opted out',
  );
  // mailauth's own reading of the authors: every candidate of an address with two `@` (a mail
  // client may show either), and A-labels for the opt-out list.
  for (const from of ['ceo@strict.test@lax.test', '"Bank" <ceo@strict.test@lax.test>']) {
    const message = plainMessage({ to: inbox.address, from });
    const replies = await s.send({ from: 'x@lax.test', to: [inbox.address], message });
    assertRefusedAtEom(replies, '550 5.7.1 DMARC checks failed');
  }
  await s.optOuts.add('xn--bnk-qla.test', s.clock.now());
  for (const from of ['news@optout.test@lax.test', 'a@bänk.test, x@lax.test']) {
    const message = plainMessage({ to: inbox.address, from });
    const replies = await s.send({ from: 'x@lax.test', to: [inbox.address], message });
    assertRefusedAtEom(replies, '555 5.7.1 svc.test: sender domain opted out');
  }
  // More author domains than are evaluated: refused as failing DMARC.
  const crowd = Array.from({ length: 6 }, (_, i) => `a@d${i}.example`).join(', ');
  assertRefusedAtEom(
    await s.send({
      from: 'x@lax.test',
      to: [inbox.address],
      message: plainMessage({ to: inbox.address, from: crowd }),
    }),
    '550 5.7.1 DMARC checks failed',
  );
  const body = await poll(inbox);
  assert.deepEqual(
    body.rejections.map((e: { sender_domain: string; envelope_from: string }) => [
      e.sender_domain,
      e.envelope_from,
    ]),
    [
      ['optout.test', 'bounce@lax.test'],
      ['optout.test', 'x@lax.test'],
      ['xn--bnk-qla.test', 'x@lax.test'],
    ],
  );
  assert.equal(body.messages.length, 0);
  // Several domains none of which refuses: delivered, with no DMARC verdict.
  const other = await s.provision();
  const both = plainMessage({ to: other.address, from: 'a@allowed.test, b@lax.test' });
  const delivered = await s.send({ from: 'a@allowed.test', to: [other.address], message: both });
  assert.match(delivered.end?.text ?? '', /^250 /);
});

test('a From: domain a reader shows as another (a soft hyphen, a zero-width space, full-width letters) is checked as shown: p=reject and opt-outs apply', async () => {
  const inbox = await s.provision();
  // UTS-46, as a mail reader maps the name: each is shown as strict.test (p=reject, SPF fails).
  for (const from of [
    'ceo@str\u00adict.test',
    'ceo@strict.test\u200b',
    'ceo@\uff53\uff54\uff52\uff49\uff43\uff54.test',
  ]) {
    assertRefusedAtEom(
      await s.send({
        from: 'x@lax.test',
        to: [inbox.address],
        message: plainMessage({ to: inbox.address, from }),
      }),
      '550 5.7.1 DMARC checks failed',
    );
  }
  assertRefusedAtEom(
    await s.send({
      from: 'x@lax.test',
      to: [inbox.address],
      message: plainMessage({ to: inbox.address, from: 'news@opt\u00adout.test' }),
    }),
    '555 5.7.1 svc.test: sender domain opted out',
  );
  const body = await poll(inbox);
  assert.deepEqual(
    body.rejections.map((e: { reason: string; sender_domain: string }) => [e.reason, e.sender_domain]),
    [['sender_opted_out', 'optout.test']],
  );
  assert.equal(body.messages.length, 0);
});

test('a From: domain DMARC cannot read as a mail reader would (white space or a comment at a dot) is refused as failing DMARC; an opt-out still wins, also beside too many domains or with trailing dots', async () => {
  const inbox = await s.provision();
  for (const from of ['Bank <ceo@strict .test>', 'ceo@strict.(x)test', 'news@allowed. test']) {
    const message = plainMessage({ to: inbox.address, from });
    assertRefusedAtEom(
      await s.send({ from: 'x@lax.test', to: [inbox.address], message }),
      '550 5.7.1 DMARC checks failed',
    );
  }
  const crowd = ['a@optout.test', ...Array.from({ length: 5 }, (_, i) => `a@d${i}.example`)].join(', ');
  const dots = await dkimSignFor(
    'optout.test',
    plainMessage({ to: inbox.address, from: 'news@optout.test..' }),
  );
  for (const message of [plainMessage({ to: inbox.address, from: crowd }), dots]) {
    assertRefusedAtEom(
      await s.send({ from: 'x@lax.test', to: [inbox.address], message }),
      '555 5.7.1 svc.test: sender domain opted out',
    );
  }
  const body = await poll(inbox);
  assert.deepEqual(
    body.rejections.map((e: { reason: string; sender_domain: string }) => [e.reason, e.sender_domain]),
    [
      ['sender_opted_out', 'optout.test'],
      ['sender_opted_out', 'optout.test'],
    ],
  );
});

test('a From: domain that opted out gets 555 5.7.1 sender domain opted out at end of data, recorded with that domain', async () => {
  const inbox = await s.provision();
  const at = iso(s.clock.now());
  const message = await dkimSignFor(
    'optout.test',
    plainMessage({
      to: inbox.address,
      from: 'News <news@optout.test>',
      messageId: '<eom-optout@optout.test>',
    }),
  );
  const replies = await s.send({ from: 'bounces@allowed.test', to: [inbox.address], message });
  assertRefusedAtEom(replies, '555 5.7.1 svc.test: sender domain opted out');
  await assertRecorded(inbox, [
    {
      at,
      envelope_from: 'bounces@allowed.test',
      reason: 'sender_opted_out',
      sender_domain: 'optout.test',
      size_bytes: message.length,
    },
  ]);
});

test('a From: subdomain of an opted-out domain, unsigned, gets 555 5.7.1 sender domain opted out at end of data, recorded naming the opted-out domain', async () => {
  const inbox = await s.provision();
  const at = iso(s.clock.now());
  const message = plainMessage({ to: inbox.address, from: 'News <news@mail.optout.test>' });
  const replies = await s.send({ from: 'bounces@allowed.test', to: [inbox.address], message });
  assertRefusedAtEom(replies, '555 5.7.1 svc.test: sender domain opted out');
  await assertRecorded(inbox, [
    {
      at,
      envelope_from: 'bounces@allowed.test',
      reason: 'sender_opted_out',
      sender_domain: 'optout.test',
      size_bytes: message.length,
    },
  ]);
});

test('mail whose authenticated From: domain is not in sender_domains gets 451 4.7.1 at end of data, recorded with that domain', async () => {
  const inbox = await s.provision(['other.test']);
  const at = iso(s.clock.now());
  const message = plainMessage({ to: inbox.address, messageId: '<not-listed-1@allowed.test>' });
  const replies = await s.send({ to: [inbox.address], message });
  assertRefusedAtEom(replies, '451 4.7.1 svc.test: sender not allowed by this inbox, try again later');
  await assertRecorded(inbox, [
    {
      at,
      envelope_from: 'sender@allowed.test',
      reason: 'sender_not_allowed',
      sender_domain: 'allowed.test',
      size_bytes: message.length,
    },
  ]);

  // The same inbox takes mail from the listed domain.
  const listed = await s.send({
    from: 'sender@other.test',
    to: [inbox.address],
    message: await dkimSignFor(
      'other.test',
      plainMessage({ to: inbox.address, from: 'sender@other.test', messageId: '<listed-1@other.test>' }),
    ),
  });
  assert.match(listed.end?.text ?? '', /^250 2\.0\.0 Ok: queued as \w+$/);
  refusedIn.set(inbox, ['<listed-1@other.test>']);
});

test('unauthenticated mail to an inbox with sender_domains gets 451 4.7.1, recorded with sender_domain null', async () => {
  const inbox = await s.provision(['other.test']);
  const at = iso(s.clock.now());
  const message = plainMessage({ to: inbox.address, from: 'Lax <sender@lax.test>' });
  const replies = await s.send({ from: 'sender@lax.test', to: [inbox.address], message });
  assertRefusedAtEom(replies, '451 4.7.1 svc.test: sender not allowed by this inbox, try again later');
  await assertRecorded(inbox, [
    {
      at,
      envelope_from: 'sender@lax.test',
      reason: 'sender_not_allowed',
      sender_domain: null,
      size_bytes: message.length,
    },
  ]);
});

test('retries of one message not admitted by sender_domains are one event per Message-ID, and rejection_count counts every attempt', async () => {
  const inbox = await s.provision(['other.test']);
  const refusal = '451 4.7.1 svc.test: sender not allowed by this inbox, try again later';
  const event = (at: string, message: Buffer) => ({
    at,
    envelope_from: 'sender@allowed.test',
    reason: 'sender_not_allowed',
    sender_domain: 'allowed.test',
    size_bytes: message.length,
  });
  const retried = plainMessage({ to: inbox.address, messageId: '<retried-1@allowed.test>' });
  const firstAt = iso(s.clock.now());
  assertRefusedAtEom(await s.send({ to: [inbox.address], message: retried }), refusal);
  // Listed by a poll before the retries come: they still are the same event.
  assert.deepEqual((await poll(inbox)).rejections, [event(firstAt, retried)]);
  s.clock.advance(300);
  assertRefusedAtEom(await s.send({ to: [inbox.address], message: retried }), refusal);
  s.clock.advance(300);
  assertRefusedAtEom(await s.send({ to: [inbox.address], message: retried }), refusal);
  assert.equal(await rejectionCount(inbox), 3);

  const another = plainMessage({ to: inbox.address, messageId: '<another-1@allowed.test>' });
  const anotherAt = iso(s.clock.now());
  assertRefusedAtEom(await s.send({ to: [inbox.address], message: another }), refusal);
  await assertRecorded(inbox, [event(firstAt, retried), event(anotherAt, another)], 4);
});

test('after the sender-domains call adds the domain, the retry of a refused message is delivered', async () => {
  const inbox = await s.provision(['other.test']);
  const message = plainMessage({ to: inbox.address, messageId: '<later-wanted@allowed.test>' });
  assertRefusedAtEom(
    await s.send({ to: [inbox.address], message }),
    '451 4.7.1 svc.test: sender not allowed by this inbox, try again later',
  );
  const updated = await s.api.put(`/v1/inboxes/${inbox.inbox_id}/sender-domains`, {
    token: inbox.credentials.owner,
    body: { sender_domains: ['other.test', 'allowed.test'] },
  });
  assert.equal(updated.status, 200, updated.text);
  const retry = await s.send({ to: [inbox.address], message });
  assert.match(retry.end?.text ?? '', /^250 2\.0\.0 Ok: queued as \w+$/);
  const body = await s.waitFor('the retried message in poll', async () => {
    const b = await poll(inbox);
    return b.messages.length > 0 ? b : undefined;
  });
  assert.equal(body.messages[0].internet_message_id, '<later-wanted@allowed.test>');
  assert.equal(body.rejections.length, 1);
  assert.equal(body.inbox.rejection_count, 1);
});

test('a message larger than the free quota gets 555 5.7.1 mailbox quota exceeded at end of data, recorded with its size and authenticated From: domain', async () => {
  const inbox = await s.provision();
  const first = messageOfSize(6000, { to: inbox.address, messageId: '<fits@allowed.test>' });
  const accepted = await s.send({ to: [inbox.address], message: first });
  assert.match(accepted.end?.text ?? '', /^250 2\.0\.0 Ok: queued as \w+$/);
  await s.waitFor('the first message in poll', async () => {
    const body = await poll(inbox);
    return body.messages.length === 1 ? body : undefined;
  });

  // 4000 bytes fit in the quota, not in what the first message left free.
  const at = iso(s.clock.now());
  const second = messageOfSize(4000, { to: inbox.address, messageId: '<too-big@allowed.test>' });
  const replies = await s.send({ from: 'big@allowed.test', to: [inbox.address], message: second });
  assertRefusedAtEom(replies, '555 5.7.1 svc.test: mailbox quota exceeded');
  const body = await poll(inbox);
  assert.deepEqual(
    body.messages.map((m: { internet_message_id: string }) => m.internet_message_id),
    ['<fits@allowed.test>'],
    'only the first message is stored',
  );
  assert.deepEqual(body.rejections, [
    {
      at,
      envelope_from: 'big@allowed.test',
      reason: 'quota',
      sender_domain: 'allowed.test',
      size_bytes: 4000,
    },
  ]);
  assert.equal(body.inbox.rejection_count, 1);
});

test('an unauthenticated message larger than the free quota is recorded as quota with sender_domain null', async () => {
  const inbox = await s.provision();
  const at = iso(s.clock.now());
  const message = messageOfSize(QUOTA + 2000, { to: inbox.address, from: 'Lax <sender@lax.test>' });
  const replies = await s.send({ from: 'sender@lax.test', to: [inbox.address], message });
  assertRefusedAtEom(replies, '555 5.7.1 svc.test: mailbox quota exceeded');
  await assertRecorded(inbox, [
    { at, envelope_from: 'sender@lax.test', reason: 'quota', sender_domain: null, size_bytes: QUOTA + 2000 },
  ]);
});

// --- the cap on held rejections ----------------------------------------------------------------------

test('at most MAX_REJECTIONS rejections are held, the oldest kept, while rejection_count counts all', async () => {
  const inbox = await s.provision();
  const expected: Record<string, unknown>[] = [];
  for (let n = 1; n <= MAX_REJECTIONS + 2; n++) {
    const at = iso(s.clock.now());
    const replies = await s.send({
      from: `r${n}@allowed.test`,
      to: [inbox.address],
      mailParams: `SIZE=${QUOTA + n}`,
      message: plainMessage({ to: inbox.address }),
    });
    assertRefusedAtRcpt(replies, [atRcpt(inbox.address, '555 5.7.1 svc.test: mailbox quota exceeded')]);
    if (n <= MAX_REJECTIONS) {
      expected.push({
        at,
        envelope_from: `r${n}@allowed.test`,
        reason: 'quota',
        sender_domain: null,
        size_bytes: QUOTA + n,
      });
    }
    s.clock.advance(1);
  }
  await assertRecorded(inbox, expected, MAX_REJECTIONS + 2);
});

// --- afterwards --------------------------------------------------------------------------------------

test('no refused message reaches an inbox later: with the queue empty, every inbox that refused mail lists none', async () => {
  assert.ok(refusedIn.size >= 10, `${refusedIn.size} inboxes to check`);
  await s.waitFor('an empty Postfix queue', async () => ((await s.postfix.queueEmpty()) ? true : undefined));
  for (const [inbox, accepted] of refusedIn) {
    const body = await poll(inbox);
    assert.deepEqual(
      body.messages.map((m: { internet_message_id: string }) => m.internet_message_id),
      accepted,
      inbox.inbox_id,
    );
  }
});

// --- one verdict per transaction (DESIGN decision 3), with the contract's quota ---------------------

describe('several recipients, and inboxes closing mid-transaction (QUOTA_BYTES at its default)', () => {
  let m: MailStack;
  before(async () => {
    m = await startMailStack();
    await m.optOuts.add('optout.test', m.clock.now());
  });
  after(() => m?.close());

  async function pollOf(inbox: ProvisionedInbox) {
    const response = await m.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, {
      token: inbox.credentials.owner,
    });
    assert.equal(response.status, 200, response.text);
    return response.json;
  }

  test('a refused recipient does not stop the others: the accepted one gets the message', async () => {
    const live = await m.provision();
    const unknown = `${newInboxId()}@svc.test`;
    const replies = await m.send({
      to: [unknown, live.address],
      message: plainMessage({ to: live.address, messageId: '<mixed@allowed.test>' }),
    });
    assert.deepEqual(
      replies.rcpt.map((r) => r.text),
      [atRcpt(unknown, '555 5.7.1 svc.test: no such inbox'), RCPT_OK],
    );
    assert.equal(replies.data?.text, DATA_GO);
    assert.match(replies.end?.text ?? '', /^250 2\.0\.0 Ok: queued as \w+$/);
    const body = await m.waitFor('the message in poll', async () => {
      const b = await pollOf(live);
      return b.messages.length > 0 ? b : undefined;
    });
    assert.equal(body.messages[0].internet_message_id, '<mixed@allowed.test>');
  });

  test('a recipient whose end-of-data verdict could differ (another sender_domains list) gets 452 4.5.3 for a separate transaction', async () => {
    const open = await m.provision();
    const listed = await m.provision(['other.test']);
    const replies = await m.send({
      to: [open.address, listed.address],
      message: plainMessage({ to: open.address }),
    });
    assert.deepEqual(
      replies.rcpt.map((r) => r.text),
      [RCPT_OK, atRcpt(listed.address, '452 4.5.3 svc.test: send this recipient in a separate transaction')],
    );
    assert.match(replies.end?.text ?? '', /^250 2\.0\.0 Ok: queued as \w+$/);
    assert.equal((await pollOf(listed)).inbox.rejection_count, 0, 'a 452 is not a rejection');
  });

  test('an end-of-data refusal applies to every recipient and is recorded in each inbox', async () => {
    const a = await m.provision(['other.test']);
    const b = await m.provision(['other.test']);
    const at = iso(m.clock.now());
    const message = plainMessage({ to: a.address, messageId: '<both@allowed.test>' });
    const replies = await m.send({ to: [a.address, b.address], message });
    assert.deepEqual(
      replies.rcpt.map((r) => r.text),
      [RCPT_OK, RCPT_OK],
    );
    assert.equal(replies.data?.text, DATA_GO);
    assert.equal(replies.end?.text, '451 4.7.1 svc.test: sender not allowed by this inbox, try again later');
    for (const inbox of [a, b]) {
      const body = await pollOf(inbox);
      assert.deepEqual(body.messages, []);
      assert.deepEqual(body.rejections, [
        {
          at,
          envelope_from: 'sender@allowed.test',
          reason: 'sender_not_allowed',
          sender_domain: 'allowed.test',
          size_bytes: message.length,
        },
      ]);
      assert.equal(body.inbox.rejection_count, 1);
    }
  });

  test('a From: domain that opted out is refused at end of data for every recipient and recorded in each inbox', async () => {
    const a = await m.provision();
    const b = await m.provision();
    const at = iso(m.clock.now());
    const message = await dkimSignFor(
      'optout.test',
      plainMessage({ to: a.address, from: 'news@optout.test', messageId: '<both-optout@optout.test>' }),
    );
    const replies = await m.send({ from: 'bounces@allowed.test', to: [a.address, b.address], message });
    assert.deepEqual(
      replies.rcpt.map((r) => r.text),
      [RCPT_OK, RCPT_OK],
    );
    assert.equal(replies.end?.text, '555 5.7.1 svc.test: sender domain opted out');
    for (const inbox of [a, b]) {
      const body = await pollOf(inbox);
      assert.deepEqual(body.messages, []);
      assert.deepEqual(body.rejections, [
        {
          at,
          envelope_from: 'bounces@allowed.test',
          reason: 'sender_opted_out',
          sender_domain: 'optout.test',
          size_bytes: message.length,
        },
      ]);
    }
  });

  /** RCPT is accepted, then `meanwhile` runs, then DATA: the end-of-data reply. */
  async function closeDuringTransaction(inbox: ProvisionedInbox, meanwhile: () => Promise<void>) {
    const { client } = await SmtpClient.open(m.smtpPort, { localAddress: '127.0.0.3' });
    try {
      assert.equal((await client.command('EHLO mail.sender.test')).code, 250);
      assert.equal((await client.command('MAIL FROM:<sender@allowed.test>')).text, MAIL_OK);
      assert.equal((await client.command(`RCPT TO:<${inbox.address}>`)).text, RCPT_OK);
      await meanwhile();
      const { start, end } = await client.data(plainMessage({ to: inbox.address }));
      assert.equal(start.text, DATA_GO);
      return end?.text;
    } finally {
      await client.quit();
    }
  }

  test('an inbox cancelled after RCPT refuses at end of data with the abuse contact, not recorded', async () => {
    const inbox = await m.provision();
    const end = await closeDuringTransaction(inbox, async () => {
      await m.inboxes.cancel(inbox.inbox_id, m.clock.now());
    });
    assert.equal(end, '555 5.7.1 svc.test: address disabled for abuse; reports: abuse@svc.test');
    const target = await m.inboxes.findForDelivery(inbox.inbox_id, m.clock.now());
    assert.equal(target?.inbox.rejectionCount, 0);
    assert.equal((await m.inboxes.usage(inbox.inbox_id, m.clock.now())).messageCount, 0);
  });

  // Last in this stack: it moves the clock past every inbox's expires_at.
  test('an inbox that expires after RCPT refuses at end of data with 555 5.7.1 inbox expired, not recorded', async () => {
    const inbox = await m.provision();
    const end = await closeDuringTransaction(inbox, async () => {
      m.clock.advance(m.config.unitSeconds);
    });
    assert.equal(end, '555 5.7.1 svc.test: inbox expired');
    const body = await pollOf(inbox);
    assert.equal(body.inbox.state, 'expired');
    assert.deepEqual(body.messages, []);
    assert.deepEqual(body.rejections, []);
    assert.equal(body.inbox.rejection_count, 0);
  });
});
