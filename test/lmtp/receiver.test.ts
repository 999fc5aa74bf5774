/**
 * The LMTP receiver end to end: Postfix's side of the wire (a raw LMTP client with XFORWARD, and
 * nodemailer's LMTP client), the DeliveryService, Postgres, and what the API then lists and serves
 * (contract section 2 "Message summary", section 4 "Receiving mail"; DESIGN decisions 1, 5, 6, 7).
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { createTransport } from 'nodemailer';
import pg from 'pg';
import { CheckedClock } from '../../src/core/clock-check.ts';
import {
  DEFAULT_READ_AHEAD_BYTES,
  DEFAULT_STALL_MS,
  DEFAULT_STORE_DEADLINE_MS,
} from '../../src/core/delivery-service.ts';
import type { ProvisionedInbox } from '../../src/core/inbox-service.ts';
import type { MessageStore } from '../../src/core/ports.ts';
import { type LmtpServer, MAX_RECIPIENTS, SOCKET_TIMEOUT_MS } from '../../src/lmtp/server.ts';
import type { LogLine } from '../../src/log.ts';
import { CHUNK_BYTES } from '../../src/storage/message-store.ts';
import { iso } from '../support/assertions.ts';
import { type Harness, startHarness } from '../support/harness.ts';
import { deliverRaw, LmtpClient } from './lmtp-client.ts';
import { startTestReceiver } from './test-receiver.ts';

let h: Harness;
let lmtp: LmtpServer;
let port: number;
const logs: LogLine[] = [];
let identCounter = 0;
const ident = () => `4jWnfY${process.pid}Q${++identCounter}`;

before(async () => {
  h = await startHarness({ POLL_RATE_BURST: '100000' });
  lmtp = await startTestReceiver(h, { log: (line) => logs.push(line) });
  port = lmtp.port as number;
});
after(async () => {
  await lmtp.close();
  await h.close();
});

const address = (inbox: ProvisionedInbox) => inbox.address;

async function poll(inbox: ProvisionedInbox) {
  const response = await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, {
    token: inbox.credentials.reader,
  });
  assert.equal(response.status, 200, response.text);
  return response.json.messages as Record<string, unknown>[];
}

async function rows(sql: string, values: unknown[] = []): Promise<Record<string, unknown>[]> {
  const client = new pg.Client({ connectionString: h.database.url });
  await client.connect();
  try {
    return (await client.query(sql, values)).rows;
  } finally {
    await client.end();
  }
}

/** Our milter's field: authserv-id = AUTHSERV_ID (mx.inbox.test in the harness). */
const OUR_AR = (id: string) =>
  `Authentication-Results: ${id};\r\n dkim=pass header.i=@example.org header.s=sel header.a=rsa-sha256 header.b=PByekjoH;\r\n spf=softfail (${id}: domain of bounces@bounce.example.org does not designate 127.0.0.3 as permitted sender) smtp.mailfrom=bounces+x@bounce.example.org smtp.helo=mail.sender.test;\r\n dmarc=pass (p=REJECT arc=none) header.from=example.org header.d=example.org\r\n`;

const MESSAGE = (extraTop: string, messageId: string) =>
  Buffer.concat([
    Buffer.from(
      `${extraTop}Received: from mail.sender.test (mail.sender.test [127.0.0.3])\r\n\tby mx.inbox.test (Postfix) with ESMTPS id 4jWnfY00CrzJJ9t\r\n` +
        `From: =?UTF-8?Q?Ada_Lovel=C3=A6ce?= <ada@example.org>\r\nTo: someone@inbox.test\r\n` +
        `Subject: =?UTF-8?B?R3LDvMOfZSBhdXMg?=\r\n =?UTF-8?Q?M=C3=BCnchen?=\r\nMessage-ID: ${messageId}\r\n` +
        `MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: 8bit\r\n\r\n` +
        `Grüße.\r\n.a line that starts with a dot\r\n..two dots\r\n.\r\n`,
    ),
    Buffer.from([0xe2, 0x82, 0xac, 0x0d, 0x0a, 0x80, 0xff, 0x00, 0x0d, 0x0a]),
    Buffer.from('last line\r\n'),
  ]);

test('a delivery with XFORWARD IDENT is listed by poll with every summary field and downloads byte for byte', async () => {
  const inbox = await h.provision();
  const raw = MESSAGE(OUR_AR(h.config.authservId), '  <abc.123@example.org>  ');
  const receivedAt = iso(h.clock.now());
  const { replies } = await deliverRaw(
    { port },
    { ident: ident(), from: 'bounces+x@bounce.example.org', to: [address(inbox)], body: raw },
  );

  const [message] = await poll(inbox);
  assert.ok(message, 'the message is listed');
  assert.deepEqual(replies, [`250 2.0.0 ${message.message_id} stored`]);
  assert.deepEqual(
    { ...message, message_id: undefined, url: undefined, delete_after: undefined },
    {
      message_id: undefined,
      url: undefined,
      delete_after: undefined,
      from: { name: 'Ada Lovelæce', address: 'ada@example.org' },
      envelope_from: 'bounces+x@bounce.example.org',
      subject: 'Grüße aus München',
      size_bytes: raw.length,
      received_at: receivedAt,
      downloaded_at: null,
      internet_message_id: '<abc.123@example.org>',
      authentication: {
        dmarc: { result: 'pass', domain: 'example.org' },
        dkim: { result: 'pass', domain: 'example.org' },
        spf: { result: 'softfail', domain: 'bounce.example.org' },
      },
    },
  );
  const download = await h.api.get(message.url as string, { token: inbox.credentials.reader });
  assert.equal(download.status, 200);
  assert.ok(download.bytes.equals(raw), 'the download is the message as received, byte for byte');
});

test('the same queue id delivered twice is stored once, and both deliveries are answered 250', async () => {
  const inbox = await h.provision();
  const queueId = ident();
  const body = 'From: a@example.org\r\nSubject: twice\r\n\r\nbody\r\n';
  const first = await deliverRaw(
    { port },
    { ident: queueId, from: 'a@example.org', to: [address(inbox)], body },
  );
  const second = await deliverRaw(
    { port },
    { ident: queueId, from: 'a@example.org', to: [address(inbox)], body },
  );
  const messages = await poll(inbox);
  assert.equal(messages.length, 1);
  const id = messages[0]?.message_id;
  assert.deepEqual(first.replies, [`250 2.0.0 ${id} stored`]);
  assert.deepEqual(second.replies, [`250 2.0.0 ${id} already stored`]);
  const stored = await rows('SELECT count(*)::int AS n FROM messages WHERE queue_id = $1', [queueId]);
  assert.equal(stored[0]?.n, 1);
});

test('two recipients in one transaction get two replies in RCPT order, and both inboxes store the message', async () => {
  const [a, b] = [await h.provision(), await h.provision()];
  const body = 'From: a@example.org\r\nSubject: both\r\n\r\nbody\r\n';
  const { replies } = await deliverRaw(
    { port },
    { ident: ident(), from: 'a@example.org', to: [address(a), address(b)], body },
  );
  const [ma] = await poll(a);
  const [mb] = await poll(b);
  assert.deepEqual(replies, [`250 2.0.0 ${ma?.message_id} stored`, `250 2.0.0 ${mb?.message_id} stored`]);
  assert.equal(ma?.subject, 'both');
  assert.equal(mb?.subject, 'both');
});

test('a recipient that is not a live inbox is answered 250 and nothing is stored for it; the inbox recipient is stored', async () => {
  const inbox = await h.provision();
  const queueId = ident();
  const to = [
    `0123456789abcdefghjk@${h.config.mailDomain}`, // well formed, no such inbox (purged): the store's FK refuses
    address(inbox),
    'someone@other.test', // another domain
    `not-an-inbox@${h.config.mailDomain}`,
    `${inbox.inbox_id.toUpperCase()}@${h.config.mailDomain.toUpperCase()}`, // the same inbox, other case
    address(inbox), // a repeated RCPT: RFC 2033 wants a reply for it too
  ];
  const { replies } = await deliverRaw(
    { port },
    { ident: queueId, from: 'a@example.org', to, body: 'Subject: x\r\n\r\nbody\r\n' },
  );
  const [message] = await poll(inbox);
  const stored = `250 2.0.0 ${message?.message_id} stored`;
  const discarded = '250 2.0.0 not stored: no such inbox';
  assert.deepEqual(replies, [discarded, stored, discarded, discarded, stored, stored]);
  assert.deepEqual(await rows('SELECT inbox_id FROM messages WHERE queue_id = $1', [queueId]), [
    { inbox_id: inbox.inbox_id },
  ]);
  assert.ok(logs.some((l) => l.msg === 'recipient not stored: no such inbox' && l.queue_id === queueId));
});

test('with an IDN mail domain (A-labels) the recipient is the inbox, though smtp-server hands its domain over in Unicode', async () => {
  const inbox = await h.provision();
  const idn = await startTestReceiver(h, { settings: { mailDomain: 'xn--bcher-kva.example' } });
  try {
    const queueId = ident();
    const { replies } = await deliverRaw(
      { port: idn.port as number },
      {
        ident: queueId,
        from: 'a@example.org',
        to: [`${inbox.inbox_id}@xn--bcher-kva.example`, `${inbox.inbox_id}@XN--BCHER-KVA.example`],
        body: 'Subject: idn\r\n\r\nbody\r\n',
      },
    );
    const [message] = await poll(inbox);
    assert.equal(message?.subject, 'idn');
    const stored = `250 2.0.0 ${message?.message_id} stored`;
    assert.deepEqual(replies, [stored, stored]);
  } finally {
    await idn.close();
  }
});

test("while this host's clock disagrees with PostgreSQL's, every recipient is deferred with 451 and nothing is stored", async () => {
  const inbox = await h.provision();
  const clock = new CheckedClock(h.clock);
  clock.skewed = "this host's clock is 1200 s ahead of PostgreSQL's (more than 30 s)";
  const skewed = await startTestReceiver(h, { clock, log: (line) => logs.push(line) });
  try {
    const queueId = ident();
    const { replies } = await deliverRaw(
      { port: skewed.port as number },
      {
        ident: queueId,
        from: 'a@example.org',
        to: [address(inbox), address(inbox)],
        body: 'Subject: x\r\n\r\nbody\r\n',
      },
    );
    const deferred = '451 4.3.0 inbox.test: temporary failure storing the message, try again later';
    assert.deepEqual(replies, [deferred, deferred]);
    assert.deepEqual(await poll(inbox), []);
    assert.ok(logs.some((l) => l.msg === 'delivery deferred: clock' && l.queue_id === queueId));
    // Once the clocks agree, the retry is stored.
    clock.skewed = null;
    const retry = await deliverRaw(
      { port: skewed.port as number },
      { ident: queueId, from: 'a@example.org', to: [address(inbox)], body: 'Subject: x\r\n\r\nbody\r\n' },
    );
    assert.match(retry.replies[0] ?? '', /^250 2\.0\.0 \S+ stored$/);
  } finally {
    await skewed.close();
  }
});

test('recipients past MAX_RECIPIENTS in one transaction (duplicates counted) get 452 4.5.3, never a 5xx', async () => {
  const inbox = await h.provision();
  const client = await LmtpClient.connect({ port });
  try {
    await client.command('LHLO postfix.test');
    await client.command('MAIL FROM:<a@example.org>');
    const replies = new Set<string>();
    for (let i = 0; i < MAX_RECIPIENTS; i++) replies.add(await client.command(`RCPT TO:<${address(inbox)}>`));
    assert.deepEqual([...replies], ['250 Accepted']);
    assert.equal(
      await client.command(`RCPT TO:<${address(inbox)}>`),
      '452 4.5.3 too many recipients, send the others in another transaction',
    );
    assert.match(await client.command('RSET'), /^250 /);
  } finally {
    await client.quit();
  }
});

test("the receiver's idle timeout outlasts the store's own bounds, so a message waiting for a store slot is not cut off", () => {
  assert.equal(lmtp.server.options.socketTimeout, SOCKET_TIMEOUT_MS);
  // smtp-server's default (60 s) sent `421 Timeout` to a streamed message whose bytes stopped while it
  // waited for a slot held by healthy stores (each may take up to the stall and store deadlines).
  assert.ok(SOCKET_TIMEOUT_MS > DEFAULT_STALL_MS + DEFAULT_STORE_DEADLINE_MS);
});

test('a delivery into an inbox that has ended is answered 250 saying so, never "stored", and counted apart', async () => {
  const expired = await h.provision();
  h.clock.advance(h.config.unitSeconds + 61); // past the expiry sweep's minute (the store drops it)
  const cancelled = await h.provision();
  const live = await h.provision();
  await h.inboxes.cancel(cancelled.inbox_id, h.clock.now());
  const queueId = ident();
  const { replies } = await deliverRaw(
    { port },
    {
      ident: queueId,
      from: 'a@example.org',
      to: [address(cancelled), address(expired), address(live)],
      body: 'Subject: late\r\n\r\nbody\r\n',
    },
  );
  const kept = await rows(
    'SELECT inbox_id, message_id, state FROM messages WHERE queue_id = $1 ORDER BY inbox_id',
    [queueId],
  );
  const idIn = (inbox: ProvisionedInbox) => kept.find((r) => r.inbox_id === inbox.inbox_id)?.message_id;
  assert.deepEqual(replies, [
    `250 2.0.0 ${idIn(cancelled)} not kept: inbox cancelled`,
    `250 2.0.0 ${idIn(expired)} not kept: inbox expired`,
    `250 2.0.0 ${idIn(live)} stored`,
  ]);
  assert.deepEqual((await poll(live)).length, 1);
  const states = Object.fromEntries(kept.map((r) => [r.inbox_id, r.state]));
  assert.deepEqual(states, {
    [cancelled.inbox_id]: 'deleted',
    [expired.inbox_id]: 'in_flight', // left for the expiry sweep, with no chunks
    [live.inbox_id]: 'stored',
  });
  const line = logs.find((l) => l.msg === 'delivery' && l.queue_id === queueId);
  assert.deepEqual(
    [line?.stored, line?.cancelled, line?.expired, line?.discarded],
    [1, 1, 1, 0],
    JSON.stringify(line),
  ); // Postfix's redelivery of the queue id (its reply lost) says the same, not "already stored" (until
  // 2026-11-25 the cancelled one did).
  const again = await deliverRaw(
    { port },
    {
      ident: queueId,
      from: 'a@example.org',
      to: [address(cancelled), address(expired), address(live)],
      body: 'Subject: late\r\n\r\nbody\r\n',
    },
  );
  assert.deepEqual(again.replies, [
    `250 2.0.0 ${idIn(cancelled)} not kept: inbox cancelled`,
    `250 2.0.0 ${idIn(expired)} not kept: inbox expired`,
    `250 2.0.0 ${idIn(live)} already stored`,
  ]);
});

test('authentication comes only from our Authentication-Results on the first line', async () => {
  const inbox = await h.provision();
  const deliver = (top: string, messageId: string) =>
    deliverRaw(
      { port },
      {
        ident: ident(),
        from: 'bounces+x@bounce.example.org',
        to: [address(inbox)],
        body: MESSAGE(top, messageId),
      },
    );
  await deliver(OUR_AR(h.config.authservId.toUpperCase()), '<ours@x>');
  await deliver(OUR_AR('mx.forged.example'), '<forged@x>');
  await deliver(`Received: by relay.example.org\r\n${OUR_AR(h.config.authservId)}`, '<second@x>');
  await deliver('', '<none@x>');
  const byId = new Map((await poll(inbox)).map((m) => [m.internet_message_id, m.authentication]));
  assert.deepEqual(byId.get('<ours@x>'), {
    dmarc: { result: 'pass', domain: 'example.org' },
    dkim: { result: 'pass', domain: 'example.org' },
    spf: { result: 'softfail', domain: 'bounce.example.org' },
  });
  assert.equal(byId.get('<forged@x>'), null);
  assert.equal(byId.get('<second@x>'), null);
  assert.equal(byId.get('<none@x>'), null);
});

test('the null sender and a message without From: list the envelope sender as from (null for <>)', async () => {
  const inbox = await h.provision();
  await deliverRaw(
    { port },
    { ident: ident(), from: '', to: [address(inbox)], body: 'Subject: bounce\r\n\r\nx\r\n' },
  );
  await deliverRaw(
    { port },
    { ident: ident(), from: 'env@example.org', to: [address(inbox)], body: 'Subject: plain\r\n\r\nx\r\n' },
  );
  const bySubject = new Map((await poll(inbox)).map((m) => [m.subject, m]));
  assert.deepEqual(bySubject.get('bounce')?.from, { name: null, address: null });
  assert.equal(bySubject.get('bounce')?.envelope_from, '');
  assert.deepEqual(bySubject.get('plain')?.from, { name: null, address: 'env@example.org' });
});

test('a From: without an address is listed without one, never with the envelope sender beside its name', async () => {
  for (const [header, expected] of [
    ['From: PayPal Security', { name: 'PayPal Security', address: null }],
    ['From: undisclosed-recipients:;', { name: null, address: null }],
  ] as const) {
    const inbox = await h.provision();
    await deliverRaw(
      { port },
      { ident: ident(), from: 'attacker@evil.test', to: [address(inbox)], body: `${header}\r\n\r\nx\r\n` },
    );
    const [message] = await poll(inbox);
    assert.deepEqual(message?.from, expected, header);
    assert.equal(message?.envelope_from, 'attacker@evil.test');
  }
});

test('From:, Subject: and Message-ID: after a large header block (any size the milter accepts) are read', async () => {
  const inbox = await h.provision();
  // Just under the milter's 1 MiB, in fields under its per-field bound; until 2026-11-25 the receiver
  // read only 256 KiB and listed the envelope sender, no subject and no Message-ID.
  const padding = `X-Pad: ${'p'.repeat(45_000)}\r\n`.repeat(23);
  const body = `${padding}From: Ada <ada@example.org>\r\nSubject: late fields\r\nMessage-ID: <late@example.org>\r\n\r\nx\r\n`;
  await deliverRaw({ port }, { ident: ident(), from: 'bounces@example.net', to: [address(inbox)], body });
  const [message] = await poll(inbox);
  assert.deepEqual(
    [message?.from, message?.subject, message?.internet_message_id],
    [{ name: 'Ada', address: 'ada@example.org' }, 'late fields', '<late@example.org>'],
  );
});

test('the LMTP transcript: greeting, LHLO with XFORWARD, then one literal reply per recipient in order', async () => {
  const inbox = await h.provision();
  const queueId = ident();
  const client = await LmtpClient.connect({ port });
  assert.deepEqual(
    await client.command('LHLO postfix.test'),
    '250 XFORWARD NAME ADDR PORT PROTO HELO IDENT SOURCE',
  );
  assert.equal(await client.command('XFORWARD NAME=mail.sender.test ADDR=127.0.0.3 PORT=33405'), '250 OK');
  assert.equal(
    await client.command(`XFORWARD PROTO=ESMTP HELO=mail.sender.test IDENT=${queueId} SOURCE=REMOTE`),
    '250 OK',
  );
  assert.equal(await client.command('MAIL FROM:<a@example.org>'), '250 Accepted');
  assert.equal(await client.command(`RCPT TO:<${address(inbox)}>`), '250 Accepted');
  assert.equal(await client.command('RCPT TO:<nobody@other.test>'), '250 Accepted');
  assert.equal(await client.command(`RCPT TO:<${address(inbox)}>`), '250 Accepted');
  const replies = await client.data([Buffer.from('Subject: transcript\r\n\r\nhello\r\n')], 3);
  await client.quit();
  const [message] = await poll(inbox);
  assert.deepEqual(client.transcript, [
    'S: 220 lmtp.inbox.test LMTP agent inbox receiver',
    'C: LHLO postfix.test',
    'S: 250-lmtp.inbox.test Nice to meet you, [127.0.0.1]',
    'S: 250-PIPELINING',
    'S: 250-8BITMIME',
    'S: 250-SMTPUTF8',
    'S: 250 XFORWARD NAME ADDR PORT PROTO HELO IDENT SOURCE',
    'C: XFORWARD NAME=mail.sender.test ADDR=127.0.0.3 PORT=33405',
    'S: 250 OK',
    `C: XFORWARD PROTO=ESMTP HELO=mail.sender.test IDENT=${queueId} SOURCE=REMOTE`,
    'S: 250 OK',
    'C: MAIL FROM:<a@example.org>',
    'S: 250 Accepted',
    `C: RCPT TO:<${address(inbox)}>`,
    'S: 250 Accepted',
    'C: RCPT TO:<nobody@other.test>',
    'S: 250 Accepted',
    `C: RCPT TO:<${address(inbox)}>`,
    'S: 250 Accepted',
    'C: DATA',
    'S: 354 End data with <CR><LF>.<CR><LF>',
    'C: <message>',
    'C: .',
    `S: 250 2.0.0 ${message?.message_id} stored`,
    'S: 250 2.0.0 not stored: no such inbox',
    `S: 250 2.0.0 ${message?.message_id} stored`,
    'C: QUIT',
    'S: 221 Bye',
  ]);
  assert.equal(replies.length, 3);
});

test("Postfix's pipelined XFORWARD, MAIL, RCPT and DATA are answered together, in one write", async () => {
  const inbox = await h.provision();
  // Each reply as the server socket takes it: was the socket corked, i.e. does it leave with the last?
  const writes: { reply: string; corked: boolean }[] = [];
  const spy = (socket: import('node:net').Socket) => {
    const write = socket.write;
    socket.write = function spiedWrite(this: typeof socket, ...args: Parameters<typeof write>) {
      writes.push({ reply: String(args[0]).trim(), corked: this.writableCorked > 0 });
      return write.apply(this, args);
    } as typeof write;
  };
  lmtp.server.server.once('connection', spy);
  const client = await LmtpClient.connect({ port });
  await client.command('LHLO postfix.test');
  writes.length = 0;
  await client.write(
    'XFORWARD NAME=mail.sender.test ADDR=127.0.0.3 PORT=33405\r\n' +
      `XFORWARD PROTO=ESMTP HELO=mail.sender.test IDENT=${ident()} SOURCE=REMOTE\r\n` +
      `MAIL FROM:<a@example.org>\r\nRCPT TO:<${address(inbox)}>\r\nDATA\r\n`,
  );
  for (let i = 0; i < 5; i++) await client.reply();
  assert.deepEqual(writes, [
    { reply: '250 OK', corked: false },
    { reply: '250 OK', corked: true },
    { reply: '250 Accepted', corked: true },
    { reply: '250 Accepted', corked: true },
    { reply: '354 End data with <CR><LF>.<CR><LF>', corked: true },
  ]);
  await client.write('Subject: pipelined\r\n\r\nhello\r\n.\r\n');
  assert.match((await client.reply())[0] as string, /^250 2\.0\.0 msg_\w+ stored$/);
  await client.quit();
});

test('XFORWARD attributes do not carry over to the next transaction on a cached connection', async () => {
  const inbox = await h.provision();
  const client = await LmtpClient.connect({ port });
  await client.command('LHLO postfix.test');
  const first = ident();
  await client.command(`XFORWARD IDENT=${first}`);
  await client.command('MAIL FROM:<a@example.org>');
  await client.command(`RCPT TO:<${address(inbox)}>`);
  await client.data([Buffer.from('Subject: one\r\n\r\nx\r\n')], 1);
  // the second transaction has no IDENT: it must not be taken for a redelivery of the first
  await client.command('MAIL FROM:<a@example.org>');
  await client.command(`RCPT TO:<${address(inbox)}>`);
  const [reply] = await client.data([Buffer.from('Subject: two\r\n\r\nx\r\n')], 1);
  await client.quit();
  assert.match(reply as string, /^250 2\.0\.0 msg_[0-9a-z]{20} stored$/);
  assert.deepEqual((await poll(inbox)).map((m) => m.subject).sort(), ['one', 'two']);
  assert.ok(logs.some((l) => l.msg === 'delivery without a usable XFORWARD IDENT: not idempotent'));
});

test('an RSET leaves no XFORWARD IDENT to the next transaction, which comes without XFORWARD', async () => {
  const inbox = await h.provision();
  const client = await LmtpClient.connect({ port });
  await client.command('LHLO postfix.test');
  const stale = ident();
  await client.command(`XFORWARD IDENT=${stale}`);
  await client.command('MAIL FROM:<a@example.org>');
  await client.command(`RCPT TO:<${address(inbox)}>`);
  await client.command('RSET');
  await client.command('MAIL FROM:<b@example.org>');
  await client.command(`RCPT TO:<${address(inbox)}>`);
  const [reply] = await client.data([Buffer.from('Subject: second\r\n\r\nx\r\n')], 1);
  await client.quit();
  assert.match(reply as string, /^250 2\.0\.0 msg_[0-9a-z]{20} stored$/);
  // Stored under its own made-up id: a later delivery of queue id `stale` is not taken for this one.
  const [row] = await rows('SELECT queue_id FROM messages WHERE inbox_id = $1', [inbox.inbox_id]);
  assert.match(String(row?.queue_id), /^local-/);
});

test('an XFORWARD IDENT that is not a printable queue id (xtext +00 is a NUL) is replaced, and the message stored', async () => {
  const inbox = await h.provision();
  const { replies } = await deliverRaw(
    { port },
    {
      ident: 'bad+00ident',
      from: 'a@example.org',
      to: [address(inbox)],
      body: 'Subject: odd ident\r\n\r\nx\r\n',
    },
  );
  assert.match(replies[0] as string, /^250 2\.0\.0 msg_\w+ stored$/);
  const [message] = await poll(inbox);
  const [row] = await rows('SELECT queue_id FROM messages WHERE message_id = $1', [message?.message_id]);
  assert.match(String(row?.queue_id), /^local-[0-9a-z]{20}$/);
});

test('a delivery from nodemailer LMTP client (no XFORWARD) is stored under a generated queue id', async () => {
  const inbox = await h.provision();
  const transport = createTransport({ host: '127.0.0.1', port, lmtp: true, ignoreTLS: true });
  const raw =
    'From: Bob <bob@example.org>\r\nSubject: via nodemailer\r\nMessage-ID: <nm@example.org>\r\n\r\nhi\r\n';
  const info = await transport.sendMail({ envelope: { from: 'bob@example.org', to: [address(inbox)] }, raw });
  transport.close();
  assert.deepEqual(info.accepted, [address(inbox)]);
  const [message] = await poll(inbox);
  assert.equal(message?.subject, 'via nodemailer');
  assert.deepEqual(message?.from, { name: 'Bob', address: 'bob@example.org' });
  const [row] = await rows('SELECT queue_id FROM messages WHERE message_id = $1', [message?.message_id]);
  assert.match(String(row?.queue_id), /^local-[0-9a-z]{20}$/);
});

test('a 3 MiB message streams through in pieces and downloads byte for byte', async () => {
  const inbox = await h.provision();
  const line = Buffer.from(`${'x'.repeat(70)}\r\n.${'y'.repeat(70)}\r\n`);
  const raw = Buffer.concat([
    Buffer.from('Subject: big\r\n\r\n'),
    ...Array.from({ length: 21_000 }, () => line),
  ]);
  const { replies } = await deliverRaw(
    { port },
    { ident: ident(), from: 'a@example.org', to: [address(inbox)], body: raw },
  );
  const [message] = await poll(inbox);
  assert.deepEqual(replies, [`250 2.0.0 ${message?.message_id} stored`]);
  assert.equal(message?.size_bytes, raw.length);
  const download = await h.api.get(message?.url as string, { token: inbox.credentials.reader });
  assert.ok(download.bytes.equals(raw));
});

test('the receiver listens on a unix socket too', async () => {
  const path = `/tmp/lmtp-test-${process.pid}.sock`;
  const inbox = await h.provision();
  const server = await startTestReceiver(h, {
    listen: { path },
    settings: { authservId: 'x' },
    maxMessageBytes: 1000,
  });
  try {
    assert.equal(server.address, `unix:${path}`);
    const { replies } = await deliverRaw(
      { path },
      { ident: ident(), from: 'a@example.org', to: [address(inbox)], body: 'Subject: unix\r\n\r\nx\r\n' },
    );
    assert.match(replies[0] as string, /^250 2\.0\.0 msg_\w+ stored$/);
  } finally {
    await server.close();
  }
});

test('close() lets a delivery in progress finish, refuses a new transaction with 421, then closes', async () => {
  const inbox = await h.provision();
  const server = await startTestReceiver(h, { settings: { authservId: 'x' }, maxMessageBytes: 1000 });
  const busy = await LmtpClient.connect({ port: server.port as number });
  const idle = await LmtpClient.connect({ port: server.port as number });
  await idle.command('LHLO postfix.test');
  await busy.command('LHLO postfix.test');
  await busy.command(`XFORWARD IDENT=${ident()}`);
  await busy.command('MAIL FROM:<a@example.org>');
  await busy.command(`RCPT TO:<${address(inbox)}>`);
  assert.match(await busy.command('DATA'), /^354/);
  await busy.write('Subject: during close\r\n\r\nfirst half\r\n');
  await new Promise((resolve) => setTimeout(resolve, 100));

  const closed = server.close();
  assert.match(await idle.command('MAIL FROM:<late@example.org>'), /^421 /);
  await busy.write('second half\r\n.\r\n');
  const [reply] = await busy.reply();
  assert.match(reply as string, /^250 2\.0\.0 msg_\w+ stored$/);
  await closed;
  assert.equal((await poll(inbox))[0]?.subject, 'during close');
  idle.destroy();
  busy.destroy();
});

test('close() does not wait past its grace for a delivery that never ends; that delivery stores nothing', async () => {
  const inbox = await h.provision();
  const server = await startTestReceiver(h, {
    settings: { authservId: 'x' },
    maxMessageBytes: 1000,
    closeGraceMs: 300,
  });
  const stuck = await LmtpClient.connect({ port: server.port as number });
  const queueId = ident();
  await stuck.command('LHLO postfix.test');
  await stuck.command(`XFORWARD IDENT=${queueId}`);
  await stuck.command('MAIL FROM:<a@example.org>');
  await stuck.command(`RCPT TO:<${address(inbox)}>`);
  await stuck.command('DATA');
  await stuck.write('Subject: never ends\r\n\r\nsome of the body\r\n');
  await new Promise((resolve) => setTimeout(resolve, 100));
  const started = Date.now();
  await server.close();
  assert.ok(Date.now() - started < 2000, `close took ${Date.now() - started} ms`);
  stuck.destroy();
  // the store saw the stream fail and rolled back: no message, no row for the queue id
  for (
    let i = 0;
    i < 50 && (await rows('SELECT 1 FROM messages WHERE queue_id = $1', [queueId])).length;
    i++
  ) {
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  assert.deepEqual(await rows('SELECT 1 FROM messages WHERE queue_id = $1', [queueId]), []);
  assert.deepEqual(await poll(inbox), []);
});

test('distinct inboxes beyond maxParallelStores are answered 452 4.5.3, so Postfix sends them again', async () => {
  const [a, b] = [await h.provision(), await h.provision()];
  const server = await startTestReceiver(h, {
    settings: { authservId: 'x', maxParallelStores: 1 },
    maxMessageBytes: 1000,
  });
  try {
    const queueId = ident();
    const body = 'Subject: limited\r\n\r\nx\r\n';
    const first = await deliverRaw(
      { port: server.port as number },
      { ident: queueId, from: 'a@example.org', to: [a.address, b.address, a.address], body },
    );
    const [ma] = await poll(a);
    const stored = `250 2.0.0 ${ma?.message_id} stored`;
    assert.deepEqual(first.replies, [
      stored,
      '452 4.5.3 inbox.test: too many recipients, try again later',
      stored,
    ]);
    // Postfix's retry carries only the deferred recipient, with the same queue id
    const retry = await deliverRaw(
      { port: server.port as number },
      { ident: queueId, from: 'a@example.org', to: [b.address], body },
    );
    const [mb] = await poll(b);
    assert.deepEqual(retry.replies, [`250 2.0.0 ${mb?.message_id} stored`]);
  } finally {
    await server.close();
  }
});

test('peers that stall in the middle of small messages hold no store slot: an unrelated delivery is answered at once', async () => {
  const [a, b] = [await h.provision(), await h.provision()];
  const server = await startTestReceiver(h, { settings: { maxParallelStores: 2 } });
  const stalled: LmtpClient[] = [];
  try {
    const port = server.port as number;
    for (let i = 0; i < 2; i++) {
      const client = await LmtpClient.connect({ port });
      await client.command('LHLO postfix.test');
      await client.command(`XFORWARD IDENT=${ident()}`);
      await client.command('MAIL FROM:<a@example.org>');
      await client.command(`RCPT TO:<${a.address}>`);
      await client.command('DATA');
      await client.write('Subject: stalled\r\n\r\nthe first line, and nothing more\r\n');
      stalled.push(client);
    }
    await new Promise((resolve) => setTimeout(resolve, 200));
    const began = Date.now();
    const { replies } = await deliverRaw(
      { port },
      { ident: ident(), from: 'x@example.org', to: [b.address], body: 'Subject: ok\r\n\r\nhi\r\n' },
    );
    // Until 2026-11-25 it waited for smtp-server's 60 s socket timeout to free the stalled peers' slots.
    assert.ok(Date.now() - began < 5_000, `${Date.now() - began} ms`);
    assert.match(replies[0] as string, /^250 2\.0\.0 msg_\w+ stored$/);
  } finally {
    for (const client of stalled) client.destroy();
    await server.close();
  }
});

test('a connection lost in the middle of a streamed message stores nothing, and the retry of its queue id is stored whole', async () => {
  const inbox = await h.provision();
  const server = await startTestReceiver(h, { settings: { authservId: 'x' } });
  const queueId = ident();
  const copying = () =>
    rows(
      `SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'COPY message_chunks%'
         AND state = 'active'`,
    );
  try {
    const cut = await LmtpClient.connect({ port: server.port as number });
    await cut.command('LHLO postfix.test');
    await cut.command(`XFORWARD IDENT=${queueId}`);
    await cut.command('MAIL FROM:<a@example.org>');
    await cut.command(`RCPT TO:<${address(inbox)}>`);
    await cut.command('DATA');
    // More than the read-ahead, so the store is streaming chunks into PostgreSQL when the peer goes
    // (protocol review: the close() test above sends 40 bytes, which never reach the store).
    const line = `${'x'.repeat(98)}\r\n`;
    await cut.write(
      `Subject: cut off\r\n\r\n${line.repeat(Math.ceil((DEFAULT_READ_AHEAD_BYTES * 2) / 100))}`,
    );
    for (let i = 0; i < 200 && (await copying()).length === 0; i++) {
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    assert.equal((await copying()).length, 1, 'the store is copying the body');
    cut.destroy();
    for (let i = 0; i < 200 && (await copying()).length > 0; i++) {
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    assert.deepEqual(await rows('SELECT state FROM messages WHERE queue_id = $1', [queueId]), []);
    assert.deepEqual(await rows('SELECT seq FROM message_chunks WHERE inbox_id = $1', [inbox.inbox_id]), []);

    // Postfix retries the queue id on a new connection: one whole copy.
    const body = `Subject: retried\r\n\r\n${line.repeat(5000)}`;
    const { replies } = await deliverRaw(
      { port: server.port as number },
      { ident: queueId, from: 'a@example.org', to: [address(inbox)], body },
    );
    assert.match(replies[0] as string, /^250 2\.0\.0 msg_\w+ stored$/);
    const listed = await poll(inbox);
    assert.deepEqual(
      listed.map((m) => [m.subject, m.size_bytes]),
      [['retried', Buffer.byteLength(body)]],
    );
  } finally {
    await server.close();
  }
});

test('the read-ahead before a store slot is the store chunk and one byte, so a whole message is read whole', () => {
  assert.equal(DEFAULT_READ_AHEAD_BYTES, CHUNK_BYTES + 1);
});

test('a store that never finishes once its body is read (a database that hangs) is deferred with 451 and frees its slot', async () => {
  const inbox = await h.provision();
  // A store that reads its whole body, then waits for a database that never answers.
  const hanging: MessageStore = {
    ...h.messages,
    store: async (_delivery, body) => {
      for await (const _ of body) {
        // read it all
      }
      return new Promise<never>(() => {});
    },
  };
  const serviceLogs: LogLine[] = [];
  const server = await startTestReceiver(h, {
    store: hanging,
    serviceLog: (line) => serviceLogs.push(line),
    settings: { authservId: 'x', storeDeadlineMs: 300, maxParallelStores: 1 },
  });
  try {
    for (let i = 0; i < 2; i++) {
      const began = Date.now();
      const { replies } = await deliverRaw(
        { port: server.port as number },
        { ident: ident(), from: 'a@example.org', to: [inbox.address], body: 'Subject: hang\r\n\r\nx\r\n' },
      );
      // The second gets its answer too: the first one's slot was given back. Until 2026-11-25 neither
      // was answered until the database answered.
      assert.deepEqual(replies, [
        '451 4.3.0 inbox.test: temporary failure storing the message, try again later',
      ]);
      assert.ok(Date.now() - began < 3_000, `${Date.now() - began} ms`);
    }
    assert.ok(
      serviceLogs.some((l) => l.msg === 'store failed; deferring' && /within 300 ms/.test(String(l.error))),
    );
  } finally {
    await server.close();
  }
});

test('a store held back by a lock past the stall bound is deferred with 451; the other recipient is stored', async () => {
  const [a, b] = [await h.provision(), await h.provision()];
  const stallLogs: LogLine[] = [];
  const server = await startTestReceiver(h, {
    serviceLog: (line) => stallLogs.push(line),
    settings: { authservId: 'x', stallMs: 300 },
    maxMessageBytes: 1000,
  });
  const queueId = ident();
  // Another transaction holds the row for (b, queue id): b's store waits for that lock (as for a
  // concurrent redelivery) and reads nothing meanwhile.
  const blocker = new pg.Client({ connectionString: h.database.url });
  await blocker.connect();
  try {
    await blocker.query('BEGIN');
    await blocker.query(
      `INSERT INTO messages (inbox_id, message_id, queue_id, state, size_bytes, envelope_from, reserved_at)
       VALUES ($1, 'msg_blockerblockerblocke', $2, 'in_flight', 0, 'x', now())`,
      [b.inbox_id, queueId],
    );
    const body = Buffer.concat([
      Buffer.from('Subject: stall\r\n\r\n'),
      Buffer.alloc(2_000_000, 'line of text\r\n'),
    ]);
    const delivery = deliverRaw(
      { port: server.port as number },
      { ident: queueId, from: 'a@example.org', to: [a.address, b.address], body },
    );
    await new Promise((resolve) => setTimeout(resolve, 800));
    await blocker.query('ROLLBACK');
    const { replies } = await delivery;
    const [ma] = await poll(a);
    assert.deepEqual(replies, [
      `250 2.0.0 ${ma?.message_id} stored`,
      '451 4.3.0 inbox.test: temporary failure storing the message, try again later',
    ]);
    assert.equal((await poll(b)).length, 0);
    assert.ok(stallLogs.some((l) => l.msg === 'store stalled; deferring' && l.inbox_id === b.inbox_id));
  } finally {
    await blocker.end();
    await server.close();
  }
});
