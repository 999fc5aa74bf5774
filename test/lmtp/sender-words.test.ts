/**
 * What the SMTP client wrote, as Postfix's lmtp(8) passes it on, taken by the receiver:
 * - MAIL FROM (src/lmtp/mail-from.ts): every reverse-path Postfix accepted, with smtp-server's own parser
 *   shown refusing the same commands with a 501 (which would bounce the queued message). The end-to-end
 *   case through a real Postfix is in test/mail/delivery.test.ts.
 * - XFORWARD (src/lmtp/xforward.ts): a UTF-8 HELO, xtext-encoded, no longer costs the message its queue
 *   id (smtp-server refused the whole command, IDENT included).
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import type { ProvisionedInbox } from '../../src/core/inbox-service.ts';
import { mailboxOf, mailFromParser, splitReversePath } from '../../src/lmtp/mail-from.ts';
import type { LmtpServer } from '../../src/lmtp/server.ts';
import { keptAttributes, xforwardReader } from '../../src/lmtp/xforward.ts';
import { type Harness, startHarness } from '../support/harness.ts';
import { LmtpClient } from './lmtp-client.ts';
import { startTestReceiver } from './test-receiver.ts';

let h: Harness;
let lmtp: LmtpServer;
let identCounter = 0;
const ident = () => `4jMfR${process.pid}Q${++identCounter}`;

before(async () => {
  h = await startHarness({ POLL_RATE_BURST: '100000' });
  lmtp = await startTestReceiver(h);
});
after(async () => {
  await lmtp.close();
  await h.close();
});

/**
 * Reverse-paths as Postfix's LMTP client writes them for senders its smtpd accepted (it quotes a local
 * part that is not a dot-atom), the address the receiver should take from each, and whether
 * smtp-server's own parser refused it (it does drop a source route itself).
 */
const SENDERS: [path: string, mailbox: string, refusedBySmtpServer: boolean][] = [
  ['"john doe"@example.com', '"john doe"@example.com', true],
  ['"john..doe"@example.com', '"john..doe"@example.com', true],
  ['a_b@sub_dom.example.com', 'a_b@sub_dom.example.com', true],
  ['"a@b"@example.com', '"a@b"@example.com', true],
  ['"a>b \\"q\\""@example.com', '"a>b \\"q\\""@example.com', true],
  ['@relay.example,@other.example:user@example.com', 'user@example.com', false],
];

test('splitReversePath finds the closing ">" outside quoted strings and keeps what follows', () => {
  assert.deepEqual(splitReversePath('MAIL FROM:<a@example.com>'), { path: 'a@example.com', rest: '' });
  assert.deepEqual(splitReversePath('MAIL FROM:<>'), { path: '', rest: '' });
  assert.deepEqual(splitReversePath('mail from: <"x > y"@example.com> BODY=8BITMIME SIZE=12'), {
    path: '"x > y"@example.com',
    rest: ' BODY=8BITMIME SIZE=12',
  });
  assert.deepEqual(splitReversePath('MAIL FROM:<"a\\">b"@example.com> SMTPUTF8'), {
    path: '"a\\">b"@example.com',
    rest: ' SMTPUTF8',
  });
  assert.equal(splitReversePath('MAIL FROM:<"never closed@example.com>'), undefined);
  assert.equal(splitReversePath('MAIL FROM:a@example.com'), undefined);
  assert.equal(splitReversePath('RCPT TO:<a@example.com>'), undefined);
});

test('mailboxOf drops a source route and nothing else', () => {
  assert.equal(mailboxOf('@a.example,@b.example:user@example.com'), 'user@example.com');
  assert.equal(mailboxOf('@a.example:user@example.com'), 'user@example.com');
  assert.equal(mailboxOf('"@x:"@example.com'), '"@x:"@example.com');
  assert.equal(mailboxOf(''), '');
});

/** MAIL's reply in a fresh session (LHLO first), then the session ends. */
async function mailReply(path: string, params = ''): Promise<string> {
  const client = await LmtpClient.connect({ port: lmtp.port as number });
  try {
    await client.command('LHLO postfix.test');
    return await client.command(`MAIL FROM:<${path}>${params}`);
  } finally {
    await client.quit();
  }
}

test("smtp-server's own parser refuses these senders with 501 (a source route it takes); ours takes them all", async () => {
  mailFromParser.uninstall();
  try {
    for (const [path, , refused] of SENDERS) {
      assert.equal(
        await mailReply(path),
        refused ? '501 Error: Bad sender address syntax' : '250 Accepted',
        path,
      );
    }
  } finally {
    assert.equal(mailFromParser.install(), true);
  }
  for (const [path] of SENDERS)
    assert.equal(await mailReply(path, ' BODY=8BITMIME SIZE=300'), '250 Accepted', path);
});

test('parameters still go through smtp-server: a BODY it does not know is refused, a plain sender unchanged', async () => {
  assert.equal(
    await mailReply('"john doe"@example.com', ' BODY=9BIT'),
    '501 Invalid BODY parameter value. Must be 7BIT or 8BITMIME',
  );
  assert.equal(await mailReply('plain@example.com', ' SIZE=x'), '501 Error: Bad message size syntax');
  assert.equal(await mailReply('plain@example.com'), '250 Accepted');
  assert.equal(await mailReply(''), '250 Accepted');
});

test('a message from each such sender is stored, its envelope sender listed as from when From: is missing', async () => {
  const inbox: ProvisionedInbox = await h.provision();
  for (const [index, [path]] of SENDERS.entries()) {
    const client = await LmtpClient.connect({ port: lmtp.port as number });
    await client.command('LHLO postfix.test');
    await client.command(`XFORWARD PROTO=ESMTP HELO=mail.sender.test IDENT=${ident()}`);
    assert.equal(await client.command(`MAIL FROM:<${path}> BODY=8BITMIME`), '250 Accepted');
    assert.equal(await client.command(`RCPT TO:<${inbox.address}>`), '250 Accepted');
    const [reply] = await client.data([Buffer.from(`Subject: sender ${index}\r\n\r\nbody\r\n`)], 1);
    await client.quit();
    assert.match(reply ?? '', /^250 2\.0\.0 msg_\w+ stored$/, path);
  }
  const response = await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, {
    token: inbox.credentials.reader,
  });
  const bySubject = new Map(
    (response.json.messages as { subject: string; from: { address: string | null } }[]).map((m) => [
      m.subject,
      m.from.address,
    ]),
  );
  assert.deepEqual(
    SENDERS.map((_, index) => bySubject.get(`sender ${index}`)),
    SENDERS.map(([, mailbox]) => mailbox),
  );
});

/** `почта.рф` as Postfix's lmtp(8) sends a client's UTF-8 HELO: xtext, byte by byte. */
const UTF8_HELO = [...Buffer.from('почта.рф')]
  .map((byte) => (byte < 0x80 ? String.fromCharCode(byte) : `+${byte.toString(16).toUpperCase()}`))
  .join('');

test('keptAttributes leaves out NAME and HELO, and leaves alone a command with nothing else', () => {
  assert.equal(
    keptAttributes(`XFORWARD PROTO=ESMTP HELO=${UTF8_HELO} IDENT=4jQ SOURCE=REMOTE`),
    'XFORWARD PROTO=ESMTP IDENT=4jQ SOURCE=REMOTE',
  );
  assert.equal(
    keptAttributes('XFORWARD NAME=a.example ADDR=192.0.2.1 PORT=25'),
    'XFORWARD ADDR=192.0.2.1 PORT=25',
  );
  assert.equal(keptAttributes('XFORWARD IDENT=4jQ'), undefined);
  assert.equal(keptAttributes('XFORWARD helo=x'), undefined);
});

test("a client's UTF-8 HELO: smtp-server refused the XFORWARD carrying IDENT; now the queue id arrives and redelivery is idempotent", async () => {
  const command = (queueId: string) =>
    `XFORWARD PROTO=ESMTP HELO=${UTF8_HELO} IDENT=${queueId} SOURCE=REMOTE`;
  const xforward = async (queueId: string) => {
    const client = await LmtpClient.connect({ port: lmtp.port as number });
    try {
      await client.command('LHLO postfix.test');
      return await client.command(command(queueId));
    } finally {
      await client.quit();
    }
  };
  xforwardReader.uninstall();
  try {
    assert.equal(await xforward(ident()), '501 Error: Bad command parameter syntax');
  } finally {
    assert.equal(xforwardReader.install(), true);
  }
  assert.equal(await xforward(ident()), '250 OK');

  const inbox: ProvisionedInbox = await h.provision();
  const queueId = ident();
  const replies: string[] = [];
  for (let attempt = 0; attempt < 2; attempt++) {
    const client = await LmtpClient.connect({ port: lmtp.port as number });
    await client.command('LHLO postfix.test');
    assert.equal(await client.command(command(queueId)), '250 OK');
    await client.command('MAIL FROM:<s@example.com>');
    await client.command(`RCPT TO:<${inbox.address}>`);
    replies.push(...(await client.data([Buffer.from('Subject: utf-8 helo\r\n\r\nbody\r\n')], 1)));
    await client.quit();
  }
  assert.equal(replies.length, 2);
  for (const reply of replies) assert.match(reply, /^250 /);
  const response = await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, {
    token: inbox.credentials.reader,
  });
  assert.equal(response.json.messages.length, 1, 'the second delivery of that queue id stored nothing');
});
