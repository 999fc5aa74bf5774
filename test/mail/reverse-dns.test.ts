/**
 * The reverse-DNS check at CONNECT (contract section 4 "Receiving mail", DESIGN decision 2 first row):
 * a client address with no PTR record is refused on connect with 550 and never reaches an inbox; a PTR
 * query that times out is a 450, so the sender tries again; any PTR record is enough, forward-confirmed
 * or not. With REQUIRE_PTR=false the check is off. Nothing here is recorded.
 *
 * Client addresses (test/support/dns-zone.ts CLIENTS): 127.0.0.2 has no PTR (NXDOMAIN), 127.0.0.4's PTR
 * query times out, 127.0.0.5 has a PTR whose name has no A record.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import type { ProvisionedInbox } from '../../src/core/inbox-service.ts';
import { CLIENTS } from '../support/dns-zone.ts';
import { type MailStack, plainMessage, startMailStack } from '../support/mail-stack.ts';
import { SmtpClient } from '../support/smtp-client.ts';

const QUEUED = /^250 2\.0\.0 Ok: queued as \w+$/;

/** One raw session from `localAddress`: the greeting, then every command's reply, literally. */
async function session(port: number, localAddress: string, commands: string[]): Promise<string[]> {
  const { client, greeting } = await SmtpClient.open(port, { localAddress });
  const transcript = [greeting.text];
  try {
    for (const command of commands) transcript.push((await client.command(command)).text);
  } finally {
    await client.quit();
  }
  return transcript;
}

async function poll(s: MailStack, inbox: ProvisionedInbox) {
  const response = await s.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, {
    token: inbox.credentials.owner,
  });
  assert.equal(response.status, 200, response.text);
  return response.json;
}

/** Waits until poll lists a message and returns its download as text. */
async function arrived(s: MailStack, inbox: ProvisionedInbox): Promise<string> {
  const body = await s.waitFor('the message in poll', async () => {
    const b = await poll(s, inbox);
    return b.messages.length > 0 ? b : undefined;
  });
  assert.equal(body.messages.length, 1);
  const download = await s.api.get(body.messages[0].url, { token: inbox.credentials.owner });
  assert.equal(download.status, 200);
  return download.bytes.toString('latin1');
}

describe('with REQUIRE_PTR on (the default)', () => {
  let s: MailStack;
  before(async () => {
    s = await startMailStack();
  });
  after(() => s?.close());

  test('a client address without a PTR record is refused on connect with 550 Sender IP reverse lookup rejected, and every command after it gets 503', async () => {
    const inbox = await s.provision();
    const transcript = await session(s.smtpPort, CLIENTS.noPtr, [
      'EHLO mail.sender.test',
      'MAIL FROM:<sender@allowed.test>',
      `RCPT TO:<${inbox.address}>`,
      'DATA',
    ]);
    const denied = '503 5.7.0 Error: access denied for unknown[127.0.0.2]';
    assert.deepEqual(transcript, [
      '550 5.7.25 <unknown[127.0.0.2]>: Client host rejected: Sender IP reverse lookup rejected',
      denied,
      denied,
      denied,
      denied,
    ]);
    const body = await poll(s, inbox);
    assert.deepEqual(body.messages, []);
    assert.deepEqual(body.rejections, [], 'a refusal on connect is not recorded');
    assert.equal(body.inbox.rejection_count, 0);
  });

  test('the whole send from a client address without a PTR record stops at the greeting', async () => {
    const inbox = await s.provision();
    const replies = await s.send({
      localAddress: CLIENTS.noPtr,
      to: [inbox.address],
      message: plainMessage({ to: inbox.address }),
    });
    assert.equal(
      replies.greeting.text,
      '550 5.7.25 <unknown[127.0.0.2]>: Client host rejected: Sender IP reverse lookup rejected',
    );
    assert.equal(replies.ehlo, undefined);
    assert.deepEqual(replies.rcpt, []);
    assert.equal((await poll(s, inbox)).inbox.rejection_count, 0);
  });

  test('a PTR query that times out gets the temporary 450 4.7.25 on connect, so the sender tries again', async () => {
    const transcript = await session(s.smtpPort, CLIENTS.ptrTimeout, ['EHLO mail.sender.test']);
    assert.deepEqual(transcript, [
      '450 4.7.25 <unknown[127.0.0.4]>: Client host rejected: Sender IP reverse lookup failed, try again later',
      '503 5.7.0 Error: access denied for unknown[127.0.0.4]',
    ]);
  });

  test('any PTR record is enough: a PTR name without an A record is greeted with 220 and its mail is delivered', async () => {
    const inbox = await s.provision();
    const replies = await s.send({
      localAddress: CLIENTS.unconfirmedPtr,
      to: [inbox.address],
      message: plainMessage({ to: inbox.address }),
    });
    assert.equal(replies.greeting.text, '220 mx.svc.test ESMTP');
    assert.deepEqual(
      replies.rcpt.map((r) => r.text),
      ['250 2.1.5 Ok'],
    );
    assert.match(replies.end?.text ?? '', QUEUED);
    const text = await arrived(s, inbox);
    // Postfix names the client "unknown": the PTR name did not resolve back, so this is the PTR-only case.
    assert.match(text, /\r\nReceived: from mail\.sender\.test \(unknown \[127\.0\.0\.5\]\)/);
  });
});

describe('with REQUIRE_PTR=false', () => {
  let s: MailStack;
  before(async () => {
    s = await startMailStack({ env: { REQUIRE_PTR: 'false' } });
  });
  after(() => s?.close());

  test('a client address without a PTR record is greeted with 220 and its mail is delivered', async () => {
    const inbox = await s.provision();
    const replies = await s.send({
      localAddress: CLIENTS.noPtr,
      to: [inbox.address],
      message: plainMessage({ to: inbox.address }),
    });
    assert.equal(replies.greeting.text, '220 mx.svc.test ESMTP');
    assert.match(replies.end?.text ?? '', QUEUED);
    const text = await arrived(s, inbox);
    assert.match(text, /\r\nReceived: from mail\.sender\.test \(unknown \[127\.0\.0\.2\]\)/);
  });
});
