/**
 * An address reaches the policy daemon unquoted (Postfix's internal form) and the milter as the client
 * wrote it (mail-address.ts). Both must mean the same inbox and report the same sender: a quoted or
 * source-routed inbox address is delivered, not refused at end of data; a bare `postmaster` beside an
 * inbox (Postfix accepts it without asking the policy daemon) does not hold the inbox's mail back; and
 * `envelope_from` is one string on the stored message and on rejections at RCPT and at end of data.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import type { ProvisionedInbox } from '../../src/core/inbox-service.ts';
import { type MailStack, plainMessage, startMailStack } from '../support/mail-stack.ts';
import { queuedAs } from '../support/smtp-client.ts';

const QUOTA_BYTES = 100_000;

let s: MailStack;
before(async () => {
  s = await startMailStack({ env: { QUOTA_BYTES: String(QUOTA_BYTES), POLL_RATE_BURST: '100000' } });
});
after(() => s?.close());

const poll = async (inbox: ProvisionedInbox) =>
  (await s.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, { token: inbox.credentials.owner })).json;

const arrived = (inbox: ProvisionedInbox, count: number) =>
  s.waitFor(`${count} message(s) in ${inbox.inbox_id}`, async () => {
    const p = await poll(inbox);
    return p.messages.length >= count ? p.messages : undefined;
  });

test('an inbox address written quoted, or behind a source route, is delivered to the inbox', async () => {
  const inbox = await s.provision();
  // The last with a comment and a space, which RFC 5321 does not allow and Postfix reads anyway.
  for (const to of [
    `"${inbox.inbox_id}"@svc.test`,
    `@relay.example:${inbox.inbox_id}@svc.test`,
    `(c)${inbox.inbox_id} @svc.test`,
  ]) {
    const replies = await s.send({ to: [to], message: plainMessage({ to: inbox.address }) });
    assert.ok(queuedAs(replies), `${to}: ${replies.end?.text}`);
  }
  assert.equal((await arrived(inbox, 3)).length, 3);
});

test('a bare postmaster beside an inbox leaves the message to the inbox; alone it is no such inbox', async () => {
  const inbox = await s.provision();
  const both = await s.send({
    to: [inbox.address, 'postmaster'],
    message: plainMessage({ to: inbox.address }),
  });
  assert.deepEqual(
    both.rcpt.map((r) => r.code),
    [250, 250],
  );
  assert.ok(queuedAs(both), both.end?.text);
  assert.equal((await arrived(inbox, 1)).length, 1);

  const alone = await s.send({ to: ['postmaster'], message: plainMessage({ to: 'postmaster' }) });
  assert.equal(alone.end?.text, '555 5.7.1 svc.test: no such inbox');
});

for (const [sender, reported] of [
  ['"john doe"@allowed.test', '"john doe"@allowed.test'],
  // Postfix takes an ESC in MAIL FROM (probed: a tab is refused 501, ESC and DEL are not): the agent
  // reads a space there, as in subject and from (security review: terminal escapes).
  ['"john\x1b[31mred"@allowed.test', '"john [31mred"@allowed.test'],
] as const) {
  test(`a quoted sender (${JSON.stringify(sender)}) is one envelope_from on the message and on rejections at RCPT and at end of data`, async () => {
    const open = await s.provision();
    const listed = await s.provision(['other.test']);
    // From: lax.test (DMARC p=none): the unaligned envelope is not refused for DMARC.
    const message = plainMessage({ to: open.address, from: 'sender@lax.test' });
    assert.ok(queuedAs(await s.send({ from: sender, to: [open.address], message })));
    // Refused at RCPT: the declared size is over the free quota.
    const big = await s.send({
      from: sender,
      to: [open.address],
      message,
      mailParams: `SIZE=${QUOTA_BYTES + 1}`,
    });
    assert.match(big.rcpt[0]?.text ?? '', /^555 5\.7\.1 .*mailbox quota exceeded/);
    // Refused at end of data: not from a listed domain.
    const unlisted = await s.send({ from: sender, to: [listed.address], message });
    assert.match(unlisted.end?.text ?? '', /^451 /);

    const [stored] = await arrived(open, 1);
    const quota = (await poll(open)).rejections;
    const notAllowed = (await poll(listed)).rejections;
    assert.deepEqual(
      [
        stored.envelope_from,
        quota[0]?.reason,
        quota[0]?.envelope_from,
        notAllowed[0]?.reason,
        notAllowed[0]?.envelope_from,
      ],
      [reported, 'quota', reported, 'sender_not_allowed', reported],
    );
  });
}

test('a sender is stored as the client sent it: no @ added, no bang path or percent hack rewritten', async () => {
  const inbox = await s.provision();
  // From: lax.test (DMARC p=none): the unaligned envelope is not refused for DMARC.
  const message = plainMessage({ to: inbox.address, from: 'sender@lax.test' });
  const senders = ['bob', 'lax.test!alice', 'alice%lax.test@allowed.test'];
  for (const from of senders) assert.ok(queuedAs(await s.send({ from, to: [inbox.address], message })), from);
  // No From: field: `from.address` is the envelope sender (contract section 2), the LMTP one here.
  const fromless = Buffer.from(`To: ${inbox.address}\r\nSubject: no from\r\n\r\nbody\r\n`);
  for (const from of senders)
    assert.ok(queuedAs(await s.send({ from, to: [inbox.address], message: fromless })), from);
  const stored: { envelope_from: string; subject: string; from: { address: string } }[] = await arrived(
    inbox,
    2 * senders.length,
  );
  const forms = stored.map((m) => [m.subject, m.envelope_from, m.from.address]).sort();
  const expected = senders.flatMap((from) => [
    ['hello', from, 'sender@lax.test'],
    ['no from', from, from],
  ]);
  assert.deepEqual(forms, expected.sort());
});

test('an SMTPUTF8 message (a UTF-8 envelope sender and From:) is delivered over LMTP and stored', async () => {
  // Postfix hands it on only to an LMTP server that offers SMTPUTF8; without that the delivery would
  // fail for good, which soft_bounce turns into deferrals until the queue lifetime drops it (review).
  const inbox = await s.provision();
  const message = Buffer.from(
    `From: Jürgen <jürgen@allowed.test>\r\nTo: ${inbox.address}\r\nSubject: Grüße\r\n` +
      'Message-ID: <utf8@allowed.test>\r\nMIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nbody\r\n',
  );
  const replies = await s.send({
    from: 'jürgen@allowed.test',
    to: [inbox.address],
    message,
    mailParams: 'SMTPUTF8',
  });
  assert.ok(queuedAs(replies), replies.end?.text);
  const [stored] = await arrived(inbox, 1);
  assert.deepEqual(
    [stored.envelope_from, stored.from, stored.subject],
    ['jürgen@allowed.test', { name: 'Jürgen', address: 'jürgen@allowed.test' }, 'Grüße'],
  );
  // Postfix's Received and our Authentication-Results come first; the rest is the bytes sent.
  const raw = (await s.api.get(stored.url, { token: inbox.credentials.owner })).bytes;
  assert.equal(raw.length, stored.size_bytes);
  assert.deepEqual(raw.subarray(raw.length - message.length), message);
});
