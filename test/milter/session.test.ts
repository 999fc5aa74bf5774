/**
 * session - the milter conversation on a real socket (127.0.0.1:0), as Postfix 3.7 holds it: literal
 * reply packets for negotiation, messages, verdicts and failures, what the handler is given, and when.
 */
import assert from 'node:assert/strict';
import net from 'node:net';
import { afterEach, describe, test } from 'node:test';
import { ACCEPT } from '../../src/core/verdict.ts';
import type { LogLine } from '../../src/log.ts';
import { FrameDecoder } from '../../src/milter/codec.ts';
import {
  HEADER_FIELD_TOO_LARGE,
  HEADERS_TOO_LARGE,
  MAX_FIELD_BYTES,
  MAX_HEADER_FIELDS,
  MAX_RECIPIENTS,
  MilterSession,
} from '../../src/milter/session.ts';
import { FakeHandler, type Started, sleep, startFake } from './fake-handler.ts';
import { envelope, MtaClient, show } from './mta-client.ts';

const QUEUE_ID = '4jWnfw5jrjzJHgc';
const u32 = (n: number) => String.fromCharCode(n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255);

let started: Started[] = [];
let clients: MtaClient[] = [];
afterEach(async () => {
  for (const mta of clients) mta.close();
  await Promise.all(started.map((s) => s.milter.close()));
  started = [];
  clients = [];
});

async function setup(
  progressIntervalMs?: number,
  decisionDeadlineMs?: number,
): Promise<Started & { mta: MtaClient }> {
  const s = await startFake(progressIntervalMs, decisionDeadlineMs);
  started.push(s);
  const mta = await MtaClient.connect(s.milter.address);
  clients.push(mta);
  return { ...s, mta };
}

/** A second connection to `address`, negotiated, with a transaction open up to end of headers. */
async function openTransaction(address: string): Promise<MtaClient> {
  const client = await MtaClient.connect(address);
  clients.push(client);
  await client.negotiate();
  await envelope(client);
  assert.equal(await headers(client, []), 'c');
  return client;
}

/** DATA (its continue checked), the headers and EOH as Postfix sends them (`i` with each); returns the EOH reply. */
async function headers(mta: MtaClient, fields: [string, string][], queueId = QUEUE_ID): Promise<string> {
  mta.macros('T', { i: queueId });
  mta.data();
  assert.equal(show(await mta.read()), 'c'); // DATA gets a reply (no NR_DATA, negotiate.ts)
  for (const [name, value] of fields) {
    mta.macros('L', { i: queueId });
    mta.header(name, value);
  }
  mta.macros('N', { i: queueId });
  mta.eoh();
  return show(await mta.read());
}

/** The body chunks (no reply each: NR_BODY), then EOM; returns every reply up to the verdict. */
async function bodyAndEnd(mta: MtaClient, chunks: string[]): Promise<string[]> {
  const replies: string[] = [];
  for (const chunk of chunks) {
    mta.macros('B', { i: QUEUE_ID });
    mta.body(chunk);
  }
  mta.macros('E', { i: QUEUE_ID });
  mta.eob();
  for (;;) {
    const reply = show(await mta.read());
    replies.push(reply);
    if (['c', 't'].includes(reply) || reply.startsWith('y')) return replies;
  }
}

const closedWithin = (mta: MtaClient, ms: number) =>
  Promise.race([mta.closed.then(() => true), sleep(ms).then(() => false)]);

describe('negotiation', () => {
  test("Postfix's offer gets version 6, actions 0x11, protocol 0x1af080; only DATA, EOH and EOM get a reply", async () => {
    const { mta } = await setup();
    assert.equal(show(await mta.negotiate()), `O${u32(6)}${u32(0x11)}${u32(0x1af080)}`);
    mta.macros('C', { j: 'mx.svc.test' });
    mta.connectInfo('mail.sender.test', '127.0.0.3');
    mta.helo('mail.sender.test');
    mta.mail('<s@allowed.test>');
    mta.rcpt('<good@svc.test>');
    mta.data();
    mta.header('Subject', ' hi');
    mta.send('U', 'XYZZY\0');
    mta.eoh();
    mta.body('x\r\n');
    assert.deepEqual((await mta.pending(100)).map(show), ['c', 'c']); // DATA and EOH
  });

  test('an MTA that offers no no-reply bits gets a continue for every event', async () => {
    const { mta } = await setup();
    const reply = await mta.negotiate({ version: 6, actions: 0x1ff, protocol: (1 << 20) | 0x3ff });
    assert.equal(show(reply), `O${u32(6)}${u32(0x11)}${u32(0x100080)}`);
    mta.connectInfo('mail.sender.test', '127.0.0.3');
    mta.helo('mail.sender.test');
    mta.mail('<s@allowed.test>');
    mta.data();
    mta.send('U', 'XYZZY\0');
    mta.header('Subject', ' hi'); // NR_HDR was offered and kept: no reply
    mta.eoh();
    mta.body('x\r\n'); // NR_BODY was not offered: a continue, once the consumer took the chunk
    assert.deepEqual((await mta.pending(100)).map(show), ['c', 'c', 'c', 'c', 'c', 'c', 'c']);
  });

  test('an MTA without HDR_LEADSPC is refused: the connection closes and the reason is logged', async () => {
    const { mta, logs } = await setup();
    mta.send('O', `${u32(2)}${u32(0x3f)}${u32(0x7f)}`);
    assert.equal(await closedWithin(mta, 1000), true);
    assert.equal(
      logs.find((l) => l.msg === 'milter negotiation refused; disconnecting')?.reason,
      'MTA offers milter protocol 2, we need 6',
    );
  });
});

describe('a message', () => {
  test('the handler sees the envelope, headers byte-exact and the body; accept sends deletes, inserts, continue', async () => {
    const { mta, handler } = await setup();
    await mta.negotiate();
    await envelope(mta, '<>', ['<a@svc.test>', '<b@svc.test>'], ['SIZE=1234', 'BODY=8BITMIME']);
    const fields: [string, string][] = [
      ['Authentication-Results', ' mx.svc.test; dkim=pass (forged)'],
      ['Subject', ' Grüße\n\tfolded'],
      ['X-Tight', 'no-space'],
      ['Authentication-Results', ' other.test; spf=pass'],
      ['Authentication-Results', ' mx.svc.test; dmarc=pass (forged)'],
    ];
    assert.equal(await headers(mta, fields), 'c');
    handler.end = async () => ({
      verdict: ACCEPT,
      edits: {
        delete: [
          { name: 'Authentication-Results', index: 1 },
          { name: 'Authentication-Results', index: 3 },
        ],
        insert: [
          { index: 0, name: 'Authentication-Results', value: 'mx.svc.test;\r\n\tspf=pass smtp.mailfrom=""' },
        ],
      },
    });
    assert.deepEqual(await bodyAndEnd(mta, ['Hello\r\n', 'World\r\n']), [
      `m${u32(3)}Authentication-Results\0\0`,
      `m${u32(1)}Authentication-Results\0\0`,
      `i${u32(0)}Authentication-Results\0 mx.svc.test;\n\tspf=pass smtp.mailfrom=""\0`,
      'c',
    ]);

    const [message] = handler.messages;
    assert.ok(message);
    const { macros, ...rest } = message.envelope;
    assert.deepEqual(rest, {
      queueId: QUEUE_ID,
      clientAddress: '127.0.0.3',
      clientName: 'mail.sender.test',
      helo: 'mail.sender.test',
      envelopeFrom: '',
      mailArgs: ['SIZE=1234', 'BODY=8BITMIME'],
      recipients: ['a@svc.test', 'b@svc.test'],
    });
    assert.equal(macros.get('v'), 'Postfix 3.7.11');
    assert.equal(macros.get('{rcpt_addr}'), 'b@svc.test');
    assert.equal(macros.get('i'), QUEUE_ID);
    // Header text is latin1, one character per byte: the rebuild is byte-exact whatever the charset.
    assert.deepEqual(
      message.headers.map((h) => [h.name, Buffer.from(h.value, 'latin1').toString('utf8')]),
      fields,
    );
    const rebuilt = message.headers.map((h) => `${h.name}:${h.value.replaceAll('\n', '\r\n')}\r\n`).join('');
    assert.deepEqual(
      Buffer.from(rebuilt, 'latin1'),
      Buffer.from(fields.map(([n, v]) => `${n}:${v.replaceAll('\n', '\r\n')}\r\n`).join('')),
    );
    assert.equal(Buffer.concat(message.chunks).toString(), 'Hello\r\nWorld\r\n');
    assert.deepEqual([message.ended, message.aborted], [1, 0]);
  });

  test('a client without a verified name has clientName null', async () => {
    const { mta, handler } = await setup();
    await mta.negotiate();
    mta.connectInfo('[127.0.0.2]', '127.0.0.2');
    mta.mail('<s@allowed.test>');
    mta.rcpt('<good@svc.test>');
    assert.equal(await headers(mta, []), 'c');
    assert.equal(handler.messages[0]?.envelope.clientName, null);
    assert.equal(handler.messages[0]?.envelope.clientAddress, '127.0.0.2');
    assert.equal(handler.messages[0]?.envelope.helo, null);
  });

  test('a reject is one replycode with the exact text, % doubled; a defer likewise', async () => {
    const { mta, handler } = await setup();
    await mta.negotiate();
    await envelope(mta);
    assert.equal(await headers(mta, [['Subject', ' a']]), 'c');
    handler.end = async () => ({
      verdict: { kind: 'reject', code: 555, dsn: '5.7.1', text: 'svc.test: 100% of quota used' },
    });
    assert.deepEqual(await bodyAndEnd(mta, ['x\r\n']), ['y555 5.7.1 svc.test: 100%% of quota used\0']);

    mta.abort();
    await envelope(mta);
    assert.equal(await headers(mta, [['Subject', ' b']]), 'c');
    handler.end = async () => ({
      verdict: { kind: 'defer', code: 451, dsn: '4.7.1', text: 'svc.test: sender not allowed' },
    });
    assert.deepEqual(await bodyAndEnd(mta, []), ['y451 4.7.1 svc.test: sender not allowed\0']);
  });
});

describe('sizes', () => {
  test('a full 65535-byte body chunk passes through unchanged', async () => {
    const { mta, handler } = await setup();
    await mta.negotiate();
    await envelope(mta);
    assert.equal(await headers(mta, []), 'c');
    const chunk = Buffer.alloc(65535, 'a');
    mta.body(chunk);
    mta.eob();
    assert.equal(show(await mta.read()), 'c');
    assert.deepEqual(handler.messages[0]?.chunks, [chunk]);
  });

  test('headers beyond MAX_HEADER_BYTES refuse the message for good (552 5.3.4) at EOH and at end of message, without asking the handler', async () => {
    const { mta, handler, logs } = await setup();
    await mta.negotiate();
    await envelope(mta);
    const big = ` ${'x'.repeat(50_000)}`;
    const refusal = `y552 5.3.4 ${HEADERS_TOO_LARGE.text}\0`;
    assert.equal(
      await headers(
        mta,
        Array.from({ length: 21 }, (): [string, string] => ['X-Big', big]),
      ),
      refusal,
    );
    // Postfix goes on to the end of the message (milter_protocol 6 lets it): the same answer, for good.
    assert.deepEqual(await bodyAndEnd(mta, []), [refusal]);
    assert.equal(handler.messages.length, 0);
    assert.equal(
      logs.some((l) => l.msg === 'milter message header too large; refused'),
      true,
    );
    // The next transaction on the connection starts afresh.
    await envelope(mta);
    assert.equal(await headers(mta, [['Subject', ' small']]), 'c');
  });

  test('a header field of more than MAX_FIELD_BYTES (Postfix may have cut it) refuses the message for good; one byte less passes', async () => {
    const { mta, handler } = await setup();
    await mta.negotiate();
    await envelope(mta);
    // `X-F:` and the value, folded lines joined by LF as Postfix sends them: MAX_FIELD_BYTES + 1 bytes.
    const value = (bytes: number) => {
      const lines = Array.from({ length: Math.floor((bytes - 4) / 71) - 1 }, () => ` ${'h'.repeat(69)}`);
      const used = lines.length * 71;
      return [...lines, ` ${'h'.repeat(bytes - 4 - used - 1)}`].join('\n');
    };
    assert.equal(`X-F:${value(MAX_FIELD_BYTES + 1)}`.length, MAX_FIELD_BYTES + 1);
    const refusal = `y552 5.3.4 ${HEADER_FIELD_TOO_LARGE.text}\0`;
    assert.equal(
      await headers(mta, [
        ['Subject', ' s'],
        ['X-F', value(MAX_FIELD_BYTES + 1)],
      ]),
      refusal,
    );
    assert.deepEqual(await bodyAndEnd(mta, []), [refusal]);
    assert.equal(handler.messages.length, 0);
    // Heard once, although answered at EOH and at end of message (uncounted until 2026-11-25).
    assert.deepEqual(handler.answers, [[QUEUE_ID, '552 5.3.4']]);
    await envelope(mta);
    assert.equal(await headers(mta, [['X-F', value(MAX_FIELD_BYTES)]]), 'c');
    assert.equal(handler.messages[0]?.headers[0]?.value.length, MAX_FIELD_BYTES - 4);
  });

  test('more than MAX_HEADER_FIELDS header fields, however short, refuse the message the same way', async () => {
    const { mta, handler } = await setup();
    await mta.negotiate();
    await envelope(mta);
    const many = Array.from({ length: MAX_HEADER_FIELDS + 1 }, (): [string, string] => ['A', ' b']);
    assert.equal(await headers(mta, many), `y552 5.3.4 ${HEADERS_TOO_LARGE.text}\0`);
    assert.equal(handler.messages.length, 0);
    await envelope(mta);
    const enough = Array.from({ length: MAX_HEADER_FIELDS }, (): [string, string] => ['A', ' b']);
    assert.equal(await headers(mta, enough), 'c');
  });
});

describe('failures become tempfail', () => {
  test('beginMessage throwing answers EOH with t, logs, and the next transaction still works', async () => {
    const { mta, handler, logs } = await setup();
    await mta.negotiate();
    await envelope(mta);
    handler.begin = () => {
      throw new Error('database down');
    };
    assert.equal(await headers(mta, [['Subject', ' a']]), 't');
    const line = logs.find((l) => l.msg === 'milter handler failed');
    assert.equal(line?.stage, 'beginMessage');
    assert.equal(line?.queue_id, QUEUE_ID);
    assert.match(String(line?.error), /database down/);

    mta.abort();
    handler.begin = () => {};
    await envelope(mta);
    assert.equal(await headers(mta, [['Subject', ' b']]), 'c');
    assert.deepEqual(await bodyAndEnd(mta, ['x\r\n']), ['c']);
    assert.deepEqual(handler.answers, [
      [QUEUE_ID, 'tempfail'],
      [QUEUE_ID, 'accept'],
    ]);
  });

  test('body() rejecting aborts the consumer and the message is answered t at its end; end() is never called', async () => {
    const { mta, handler, logs } = await setup();
    await mta.negotiate();
    await envelope(mta);
    assert.equal(await headers(mta, []), 'c');
    handler.body = async () => {
      throw new Error('write failed');
    };
    mta.body('x\r\n');
    mta.body('y\r\n');
    assert.deepEqual(await mta.pending(100), [], 'no reply to a body chunk (NR_BODY)');
    mta.eob();
    assert.equal(show(await mta.read()), 't');
    assert.deepEqual([handler.messages[0]?.ended, handler.messages[0]?.aborted], [0, 1]);
    assert.equal(logs.filter((l) => l.msg === 'milter handler failed').length, 1);
  });

  test('end() rejecting, or a verdict Postfix would refuse, answers t', async () => {
    const { mta, handler, logs } = await setup();
    await mta.negotiate();
    for (const end of [
      async () => {
        throw new Error('dns down');
      },
      async () => ({ verdict: { kind: 'defer' as const, code: 550, dsn: '5.7.1', text: 'wrong class' } }),
    ]) {
      handler.end = end;
      await envelope(mta);
      assert.equal(await headers(mta, []), 'c');
      assert.deepEqual(await bodyAndEnd(mta, ['x\r\n']), ['t']);
    }
    assert.deepEqual(
      logs.filter((l) => l.msg === 'milter handler failed').map((l) => l.stage),
      ['end', 'end'],
    );
    assert.deepEqual(
      handler.messages.map((m) => m.aborted),
      [0, 0],
    );
    // Neither verdict reached the MTA: the first end() failed (it may have reserved before failing),
    // the second resolved but its verdict could not be sent. The consumer may undo both, once each.
    assert.deepEqual(
      handler.messages.map((m) => m.undelivered),
      [1, 1],
    );
  });

  test('a verdict the connection was lost before is undelivered; a verdict sent is not', async () => {
    const { mta, handler, milter, logs } = await setup();
    await mta.negotiate();
    await envelope(mta);
    assert.equal(await headers(mta, []), 'c');
    assert.deepEqual(await bodyAndEnd(mta, ['x\r\n']), ['c']);
    assert.equal(handler.messages[0]?.undelivered, 0);
    assert.equal(handler.messages[0]?.delivered, 1, 'a verdict sent is delivered, once');

    // Postfix gives up waiting (milter_content_timeout) while the verdict is being decided: an accept
    // decided after that is undone. Lost while end() is pending, and end() then fails: what it did
    // before failing is undone. Lost, and the verdict could not have been sent either: undone once,
    // not twice.
    for (const [end, expected] of [
      [async () => ({ verdict: ACCEPT }), 1],
      [async () => Promise.reject(new Error('db down')), 1],
      [
        async () => ({
          verdict: ACCEPT,
          edits: { delete: [], insert: [{ index: 0, name: 'Bad Name', value: 'x' }] },
        }),
        1,
      ],
    ] as const) {
      const client = await openTransaction(milter.address);
      let release: () => void = () => {};
      const gate = new Promise<void>((resolve) => {
        release = resolve;
      });
      handler.end = async () => {
        await gate;
        return end();
      };
      const lostBefore = logs.filter(
        (l) => l.msg === 'milter connection lost before the verdict was sent',
      ).length;
      client.macros('E', { i: QUEUE_ID });
      client.eob();
      await sleep(50);
      client.close();
      await sleep(100);
      release();
      // The session logs the loss once end() has settled, just before it would undo the verdict.
      const lost = () => logs.filter((l) => l.msg === 'milter connection lost before the verdict was sent');
      for (let i = 0; i < 100 && lost().length === lostBefore; i++) await sleep(20);
      await sleep(20);
      assert.equal(lost().length, lostBefore + 1);
      assert.equal(handler.messages.at(-1)?.undelivered, expected);
      assert.equal(handler.messages.at(-1)?.delivered, 0);
      assert.equal(handler.messages.at(-1)?.aborted, 0);
    }
  });
});

test('a verdict that can no longer be written (the socket closed before the session heard) is undelivered', async () => {
  // The session over a socket of its own, whose writes can be refused as connection.ts refuses them
  // once the socket is destroyed: Node marks it so a moment before its 'close' event.
  const handler = new FakeHandler();
  const logs: LogLine[] = [];
  let refuse = false;
  const server = net.createServer((socket) => {
    const session = new MilterSession({
      handler,
      log: (line) => logs.push(line),
      progressIntervalMs: 10_000,
      decisionDeadlineMs: 10_000,
      id: 1,
      send: (reply) => !refuse && socket.write(reply) !== undefined,
    });
    const decoder = new FrameDecoder();
    let chain = Promise.resolve();
    socket.on('data', (chunk: Buffer) => {
      for (const packet of decoder.push(chunk))
        chain = chain.then(() => session.handle(packet).then(() => {}));
    });
    socket.on('error', () => {});
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as net.AddressInfo;
  const mta = await openTransaction(`inet:127.0.0.1:${port}`);
  try {
    refuse = true;
    mta.macros('E', { i: QUEUE_ID });
    mta.eob();
    for (let i = 0; i < 100 && handler.messages[0]?.undelivered === 0; i++) await sleep(10);
    assert.equal(handler.messages[0]?.ended, 1);
    assert.equal(handler.messages[0]?.undelivered, 1, 'the accept never reached the MTA: undone');
    assert.equal(handler.messages[0]?.delivered, 0);
    assert.ok(logs.some((l) => l.msg === 'milter connection lost before the verdict was sent'));
  } finally {
    mta.close();
    await new Promise((resolve) => server.close(resolve));
  }
});

describe('transactions', () => {
  test('ABORT ends the consumer with abort(); the next transaction has a fresh envelope and macros', async () => {
    const { mta, handler } = await setup();
    await mta.negotiate();
    await envelope(mta, '<s@allowed.test>', ['<a@svc.test>', '<b@svc.test>']);
    assert.equal(await headers(mta, [['Subject', ' first']], 'QUEUE1'), 'c');
    mta.body('x\r\n');
    mta.abort();

    mta.mail('<t@allowed.test>');
    mta.rcpt('<c@svc.test>');
    mta.header('Subject', ' second');
    mta.eoh(); // no macros this time: the first transaction's `i` must not leak
    assert.equal(show(await mta.read()), 'c');

    const [first, second] = handler.messages;
    assert.deepEqual([first?.aborted, first?.ended], [1, 0]);
    assert.equal(first?.envelope.queueId, 'QUEUE1');
    assert.deepEqual(second?.envelope.recipients, ['c@svc.test']);
    assert.equal(second?.envelope.envelopeFrom, 't@allowed.test');
    assert.equal(second?.envelope.queueId, '');
    assert.equal(second?.envelope.macros.has('{rcpt_addr}'), false);
    assert.equal(second?.envelope.macros.get('j'), 'mx.svc.test'); // connection macros stay
    assert.deepEqual(second?.headers, [{ name: 'Subject', value: ' second' }]);
  });

  test(`a message may have MAX_RECIPIENTS (${MAX_RECIPIENTS}) recipients, every one kept`, async () => {
    const { mta, handler } = await setup();
    await mta.negotiate();
    const rcpts = Array.from({ length: MAX_RECIPIENTS }, (_, i) => `<r${i}@svc.test>`);
    await envelope(mta, '<s@allowed.test>', rcpts);
    assert.equal(await headers(mta, [['Subject', ' many']]), 'c');
    assert.equal(handler.messages[0]?.envelope.recipients.length, MAX_RECIPIENTS);
  });

  test('a new MAIL in the middle of a message aborts the consumer', async () => {
    const { mta, handler } = await setup();
    await mta.negotiate();
    await envelope(mta);
    assert.equal(await headers(mta, []), 'c');
    mta.mail('<s@allowed.test>');
    mta.rcpt('<good@svc.test>');
    assert.equal(await headers(mta, []), 'c'); // the first reply since the first message's EOH
    assert.equal(handler.messages[0]?.aborted, 1);
    assert.equal(handler.messages.length, 2);
  });

  test('QUIT closes the connection and aborts a message in progress; so does a lost connection', async () => {
    const { mta, handler, milter } = await setup();
    await mta.negotiate();
    await envelope(mta);
    assert.equal(await headers(mta, []), 'c');
    mta.quit();
    assert.equal(await closedWithin(mta, 1000), true);
    assert.equal(handler.messages[0]?.aborted, 1);

    const other = await openTransaction(milter.address);
    other.close();
    await sleep(50);
    assert.equal(handler.messages[1]?.aborted, 1);
  });
});

describe('flow control', () => {
  test('while end() is slow, progress packets keep Postfix waiting, then the verdict follows', async () => {
    const { mta, handler } = await setup(50);
    await mta.negotiate();
    await envelope(mta);
    assert.equal(await headers(mta, []), 'c');
    handler.end = async () => {
      await sleep(240);
      return { verdict: ACCEPT };
    };
    const replies = await bodyAndEnd(mta, ['x\r\n']);
    assert.equal(replies.at(-1), 'c');
    const progress = replies.slice(0, -1);
    assert.ok(progress.length >= 3, `only ${progress.length} progress packets`);
    assert.deepEqual(new Set(progress), new Set(['p']));
  });

  test('an end() that fails is answered t and undone at once (it may have reserved before failing)', async () => {
    const { mta, handler } = await setup(50);
    await mta.negotiate();
    await envelope(mta);
    assert.equal(await headers(mta, []), 'c');
    handler.end = async () => {
      throw new Error('Connection terminated unexpectedly');
    };
    assert.deepEqual(await bodyAndEnd(mta, ['x\r\n']), ['t']);
    await sleep(20);
    assert.equal(handler.messages[0]?.undelivered, 1);
    assert.equal(handler.messages[0]?.delivered, 0);
  });

  test('an end() past the decision deadline that then fails is undone too', async () => {
    const { mta, handler } = await setup(50, 300);
    await mta.negotiate();
    await envelope(mta);
    assert.equal(await headers(mta, []), 'c');
    let fail = () => {};
    handler.end = () =>
      new Promise((_, reject) => {
        fail = () => reject(new Error('lock timeout'));
      });
    const replies = await bodyAndEnd(mta, ['x\r\n']);
    assert.equal(replies.at(-1), 't');
    assert.equal(handler.messages[0]?.undelivered, 0);
    fail();
    await sleep(20);
    assert.equal(handler.messages[0]?.undelivered, 1);
  });

  test('an end() past the decision deadline is answered t, and its late accept is undone', async () => {
    const { mta, handler, logs } = await setup(50, 300);
    await mta.negotiate();
    await envelope(mta);
    assert.equal(await headers(mta, []), 'c');
    let decide = () => {};
    handler.end = () =>
      new Promise((resolve) => {
        decide = () => resolve({ verdict: ACCEPT });
      });
    const replies = await bodyAndEnd(mta, ['x\r\n']);
    assert.equal(replies.at(-1), 't');
    assert.ok(replies.slice(0, -1).every((reply) => reply === 'p'));
    assert.match(String(logs.find((l) => l.msg === 'milter handler failed')?.error), /longer than 300 ms/);
    assert.equal(handler.messages[0]?.undelivered, 0);
    decide();
    await sleep(20);
    assert.equal(handler.messages[0]?.undelivered, 1);
    assert.equal(handler.messages[0]?.delivered, 0, 'the late accept never reached the MTA');
    // The connection goes on: the next message is decided as usual.
    handler.end = async () => ({ verdict: ACCEPT });
    mta.mail('<s@allowed.test>');
    mta.rcpt('<good@svc.test>');
    assert.equal(await headers(mta, [], '4jWnfw5jrjzJHgd'), 'c');
    assert.deepEqual(await bodyAndEnd(mta, ['y\r\n']), ['c']);
    // The handler hears what Postfix was told: `t` for the late accept (it was counted as an accept
    // until 2026-11-25), then the accept.
    assert.deepEqual(handler.answers, [
      [QUEUE_ID, 'tempfail'],
      ['4jWnfw5jrjzJHgd', 'accept'],
    ]);
  });

  test('the next packet is not handled before body() resolves', async () => {
    const { mta, handler } = await setup();
    await mta.negotiate();
    await envelope(mta);
    assert.equal(await headers(mta, []), 'c');
    let release = () => {};
    handler.body = () => new Promise<void>((resolve) => (release = resolve));
    mta.body('one\r\n');
    await sleep(30); // separate reads, so only our pausing can hold them back
    mta.body('two\r\n');
    await sleep(30);
    mta.eob();
    assert.deepEqual(await mta.pending(150), []);
    assert.equal(handler.messages[0]?.chunks.length, 1);
    handler.body = async () => {};
    release();
    assert.equal(show(await mta.read()), 'c'); // EOM's verdict: the chunks get no reply (NR_BODY)
    assert.deepEqual(await mta.pending(100), []);
    assert.deepEqual(handler.messages[0]?.chunks.map(String), ['one\r\n', 'two\r\n']);
    assert.equal(handler.messages[0]?.ended, 1);
  });
});

describe('protocol errors close the connection', () => {
  /** name, whether to negotiate first, the misbehaviour */
  const cases: [string, boolean, (mta: MtaClient) => void][] = [
    ['a packet length of 0', false, (mta) => mta.socket.write(Buffer.alloc(4))],
    [
      'a packet length over the maximum',
      false,
      (mta) => mta.socket.write(Buffer.from([0x7f, 0xff, 0xff, 0xff])),
    ],
    ['garbage', false, (mta) => mta.socket.write('GET / HTTP/1.1\r\n\r\n')],
    ['a second negotiation', true, (mta) => void mta.negotiate().catch(() => {})],
    ['a CONNECT without its NUL', true, (mta) => mta.send('C', 'host')],
    ['a RCPT outside a transaction', true, (mta) => mta.rcpt('<a@svc.test>')],
    [
      // Protocol review: the list grew without bound (no reply to RCPT slows a peer down).
      `RCPT number ${MAX_RECIPIENTS + 1} of one message`,
      true,
      (mta) => {
        mta.mail('<s@allowed.test>');
        for (let i = 0; i <= MAX_RECIPIENTS; i++) mta.rcpt(`<r${i}@svc.test>`);
      },
    ],
    [
      'a BODY before EOH',
      true,
      (mta) => {
        mta.mail('<s@allowed.test>');
        mta.body('x');
      },
    ],
  ];
  for (const [name, negotiateFirst, misbehave] of cases) {
    test(name, async () => {
      const { mta, logs } = await setup();
      if (negotiateFirst) await mta.negotiate();
      misbehave(mta);
      assert.equal(await closedWithin(mta, 1000), true);
      assert.equal(
        logs.some((l) => l.msg === 'milter protocol error; disconnecting'),
        true,
      );
    });
  }

  test('a command before negotiation', async () => {
    const { mta, logs } = await setup();
    mta.mail('<s@allowed.test>');
    assert.equal(await closedWithin(mta, 1000), true);
    assert.equal(
      logs.find((l) => l.msg === 'milter protocol error; disconnecting')?.reason,
      "'M' before SMFIC_OPTNEG",
    );
  });

  test('an unrecognized command is logged and ignored', async () => {
    const { mta, logs } = await setup();
    await mta.negotiate();
    mta.send('Z', 'future\0');
    await envelope(mta);
    assert.equal(await headers(mta, []), 'c');
    assert.equal(logs.find((l) => l.msg === 'milter command not recognized; ignored')?.command, 'Z');
  });
});
