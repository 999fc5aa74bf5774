/**
 * codec, negotiate, reply - the milter wire format as tables: each command Postfix sends and what it
 * decodes to, each reply we send as literal bytes, our negotiation answer to each offer, and the packets
 * each end-of-message result becomes.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { Verdict } from '../../src/core/verdict.ts';
import {
  decodeCommand,
  encodeChangeHeader,
  encodeContinue,
  encodeInsertHeader,
  encodeNegotiation,
  encodeProgress,
  encodeReplyCode,
  encodeTempfail,
  FrameDecoder,
  MAX_MACROS,
  MAX_PACKET_BYTES,
  type MilterCommand,
  MilterProtocolError,
} from '../../src/milter/codec.ts';
import type { HeaderEdits } from '../../src/milter/handler.ts';
import { expectsReply, negotiate } from '../../src/milter/negotiate.ts';
import { endOfMessageReply } from '../../src/milter/reply.ts';
import { packet } from './mta-client.ts';

const hex = (s: string): Buffer => Buffer.from(s.replaceAll(' ', ''), 'hex');
const port = (n: number): Buffer => Buffer.from([n >> 8, n & 0xff]);
const decode = (command: string, ...parts: (Buffer | string)[]): MilterCommand =>
  decodeCommand({
    command,
    data: Buffer.concat(parts.map((p) => (typeof p === 'string' ? Buffer.from(p) : p))),
  });

describe('framing', () => {
  test('packets split at every byte boundary reassemble in order', () => {
    const stream = Buffer.concat([packet('N'), packet('B', 'body\r\n'), packet('E')]);
    const decoder = new FrameDecoder();
    const out = [...stream].flatMap((byte) => decoder.push(Buffer.from([byte])));
    assert.deepEqual(
      out.map((p) => p.command + p.data.toString()),
      ['N', 'Bbody\r\n', 'E'],
    );
  });

  test('several packets in one chunk all come out, a partial one waits', () => {
    const decoder = new FrameDecoder();
    const two = Buffer.concat([
      packet('T'),
      packet('H', 'h\0'),
      packet('L', 'Subject\0 hi\0').subarray(0, 7),
    ]);
    assert.deepEqual(
      decoder.push(two).map((p) => p.command),
      ['T', 'H'],
    );
    assert.deepEqual(
      decoder.push(packet('L', 'Subject\0 hi\0').subarray(7)).map((p) => p.data.toString()),
      ['Subject\0 hi\0'],
    );
  });

  test('a packet of 1 MiB sent a byte at a time comes out whole, in linear time', { timeout: 20_000 }, () => {
    // Each read kept as a buffer of its own and shifted off one by one: about a minute here.
    const data = Buffer.alloc(1024 * 1024, 'x');
    const stream = packet('B', data);
    const decoder = new FrameDecoder();
    const out = [];
    for (let i = 0; i < stream.length; i++) out.push(...decoder.push(stream.subarray(i, i + 1)));
    assert.equal(out.length, 1);
    assert.equal(out[0]?.command, 'B');
    assert.ok(out[0]?.data.equals(data));
  });

  test('a length of 0 or above the maximum is refused before its data arrives', () => {
    for (const length of [0, MAX_PACKET_BYTES + 1, 0xffffffff]) {
      const head = Buffer.alloc(4);
      head.writeUInt32BE(length);
      assert.throws(() => new FrameDecoder().push(head), MilterProtocolError, `length ${length}`);
    }
    const max = Buffer.alloc(4);
    max.writeUInt32BE(MAX_PACKET_BYTES);
    assert.deepEqual(new FrameDecoder().push(max), []);
  });
});

describe('command decoding', () => {
  const table: [string, MilterCommand, string, ...(Buffer | string)[]][] = [
    [
      'OPTNEG as Postfix 3.7 sends it',
      { kind: 'optneg', version: 6, actions: 0x1ff, protocol: 0x1fffff },
      'O',
      hex('00000006 000001ff 001fffff'),
    ],
    [
      'MACRO for end of headers',
      { kind: 'macro', stage: 'N', macros: [['i', '4jWnfw5jrjzJHgc']] },
      'D',
      'Ni\x004jWnfw5jrjzJHgc\0',
    ],
    ['MACRO with no macros', { kind: 'macro', stage: 'H', macros: [] }, 'D', 'H'],
    [
      'CONNECT over IPv4',
      { kind: 'connect', hostname: 'mail.sender.test', family: '4', port: 40179, address: '127.0.0.3' },
      'C',
      'mail.sender.test\x004',
      port(40179),
      '127.0.0.3\0',
    ],
    [
      'CONNECT over IPv6 without a verified name',
      { kind: 'connect', hostname: '[2001:db8::1]', family: '6', port: 25, address: '2001:db8::1' },
      'C',
      '[2001:db8::1]\x006',
      port(25),
      '2001:db8::1\0',
    ],
    [
      'CONNECT over a unix socket',
      { kind: 'connect', hostname: 'localhost', family: 'L', port: 0, address: '/run/smtp' },
      'C',
      'localhost\0L',
      port(0),
      '/run/smtp\0',
    ],
    [
      'CONNECT of unknown family has no port or address',
      { kind: 'connect', hostname: 'unknown', family: 'U', port: null, address: '' },
      'C',
      'unknown\0U',
    ],
    ['HELO', { kind: 'helo', name: 'mail.sender.test' }, 'H', 'mail.sender.test\0'],
    [
      'MAIL with ESMTP args',
      { kind: 'mail', args: ['<s@allowed.test>', 'SIZE=1234', 'BODY=8BITMIME'] },
      'M',
      '<s@allowed.test>\0SIZE=1234\0BODY=8BITMIME\0',
    ],
    ['MAIL from the null sender', { kind: 'mail', args: ['<>'] }, 'M', '<>\0'],
    ['RCPT', { kind: 'rcpt', args: ['<good@svc.test>'] }, 'R', '<good@svc.test>\0'],
    ['DATA', { kind: 'data' }, 'T'],
    [
      'HEADER keeps the leading space and LF folds',
      { kind: 'header', name: 'Subject', value: ' first\n\tsecond' },
      'L',
      'Subject\0 first\n\tsecond\0',
    ],
    [
      'HEADER in UTF-8 (one latin1 character per byte)',
      { kind: 'header', name: 'Subject', value: Buffer.from(' Grüße ✉').toString('latin1') },
      'L',
      'Subject\0 Grüße ✉\0',
    ],
    ['EOH', { kind: 'eoh' }, 'N'],
    ['BODY', { kind: 'body', chunk: Buffer.from('line\r\n') }, 'B', 'line\r\n'],
    ['BODYEOB', { kind: 'eob', chunk: Buffer.alloc(0) }, 'E'],
    ['ABORT', { kind: 'abort' }, 'A'],
    ['QUIT', { kind: 'quit' }, 'Q'],
    ['QUIT_NC', { kind: 'quitNewConnection' }, 'K'],
    ['UNKNOWN', { kind: 'unknown', command: 'XYZZY' }, 'U', 'XYZZY\0'],
    ['a command byte we do not know', { kind: 'unrecognized', code: 'Z' }, 'Z', 'whatever'],
  ];
  for (const [name, expected, command, ...parts] of table) {
    test(name, () => assert.deepEqual(decode(command, ...parts), expected));
  }

  test('raw 8-bit bytes in a header survive: one latin1 character per byte', () => {
    assert.deepEqual(decode('L', 'Subject\0 ', hex('ff'), '\0'), {
      kind: 'header',
      name: 'Subject',
      value: ' \u00ff',
    });
  });

  const malformed: [string, string, ...(Buffer | string)[]][] = [
    ['OPTNEG too short', 'O', hex('00000006 000001ff')],
    ['CONNECT without port', 'C', 'host\x004'],
    ['CONNECT address not NUL-terminated', 'C', 'host\x004', port(25), '1.2.3.4'],
    ['HELO not NUL-terminated', 'H', 'helo'],
    ['MAIL without arguments', 'M'],
    ['RCPT argument not NUL-terminated', 'R', '<a@b>'],
    ['HEADER without value', 'L', 'Subject\0'],
    ['MACRO value missing', 'D', 'Ni\0'],
    ['MACRO without stage', 'D'],
  ];
  for (const [name, command, ...parts] of malformed) {
    test(`refused: ${name}`, () => assert.throws(() => decode(command, ...parts), MilterProtocolError));
  }
});

test('a MACRO packet for an unknown stage, or with more than MAX_MACROS macros, is a protocol error', () => {
  assert.throws(() => decode('D', 'Qi\0x\0'), /unknown stage Q/);
  const many = (n: number) => `M${Array.from({ length: n }, (_, i) => `m${i}\0v\0`).join('')}`;
  assert.equal((decode('D', many(MAX_MACROS)) as { macros: unknown[] }).macros.length, MAX_MACROS);
  assert.throws(() => decode('D', many(MAX_MACROS + 1)), new RegExp(`over ${MAX_MACROS} macros`));
});

describe('reply encoding', () => {
  const table: [string, Buffer, string][] = [
    ['continue', encodeContinue(), '00000001 63'],
    ['tempfail', encodeTempfail(), '00000001 74'],
    ['progress', encodeProgress(), '00000001 70'],
    [
      'replycode with % doubled',
      encodeReplyCode('550 5.7.1 100% sure'),
      `00000016 79 ${Buffer.from('550 5.7.1 100%% sure\0').toString('hex')}`,
    ],
    [
      'insert header',
      encodeInsertHeader(0, 'X-A', ' v'),
      `0000000c 69 00000000 ${Buffer.from('X-A\0 v\0').toString('hex')}`,
    ],
    [
      'change header with an empty value (delete)',
      encodeChangeHeader(3, 'X-A', ''),
      `0000000a 6d 00000003 ${Buffer.from('X-A\0\0').toString('hex')}`,
    ],
    [
      'negotiation',
      encodeNegotiation({ version: 6, actions: 0x11, protocol: 0x133080 }),
      '0000000d 4f 00000006 00000011 00133080',
    ],
  ];
  for (const [name, actual, expected] of table) {
    test(name, () => assert.equal(actual.toString('hex'), expected.replaceAll(' ', '')));
  }

  test('a NUL inside a string cannot be encoded', () => {
    assert.throws(() => encodeInsertHeader(0, 'X-A', 'a\0b'), /NUL/);
  });
});

describe('negotiation', () => {
  test("Postfix 3.7's offer gets version 6, ADDHDRS|CHGHDRS, HDR_LEADSPC and no-reply for ignored events but DATA", () => {
    assert.deepEqual(negotiate({ version: 6, actions: 0x1ff, protocol: 0x1fffff }), {
      ok: true,
      reply: { version: 6, actions: 0x11, protocol: 0x1af080 },
    });
  });

  test('no-reply bits the MTA did not offer are not claimed', () => {
    assert.deepEqual(negotiate({ version: 6, actions: 0x1ff, protocol: (1 << 20) | 0x3ff }), {
      ok: true,
      reply: { version: 6, actions: 0x11, protocol: (1 << 20) | (1 << 7) },
    });
  });

  test('a newer MTA still gets version 6', () => {
    const result = negotiate({ version: 7, actions: 0x1ff, protocol: 0xffffffff });
    assert.equal(result.ok && result.reply.version, 6);
  });

  const refused: [string, { version: number; actions: number; protocol: number }, RegExp][] = [
    ['protocol version 2', { version: 2, actions: 0x3f, protocol: 0x7f }, /protocol 2/],
    ['no header changes', { version: 6, actions: 0x1ef, protocol: 0x1fffff }, /ADDHDRS\|CHGHDRS/],
    ['no HDR_LEADSPC', { version: 6, actions: 0x1ff, protocol: 0xfffff }, /HDR_LEADSPC/],
  ];
  for (const [name, offer, reason] of refused) {
    test(`refused: ${name}`, () => {
      const result = negotiate(offer);
      assert.equal(result.ok, false);
      assert.match(result.ok ? '' : result.reason, reason);
    });
  }

  test('which commands wait for a reply under our bits', () => {
    const waits = [...'CHMRTLNBEUADQK'].filter((c) => expectsReply(c, 0x133080)).join('');
    assert.equal(waits, 'MRNBE');
    assert.equal([...'CHMRTLNBEU'].filter((c) => expectsReply(c, 0)).join(''), 'CHMRTLNBEU');
  });
});

describe('end-of-message replies', () => {
  const replies = (verdict: Verdict, edits?: HeaderEdits): string[] => {
    const out = new FrameDecoder().push(endOfMessageReply({ verdict, edits }));
    return out.map((p) => p.command + p.data.toString('latin1'));
  };
  const index = (n: number) => String.fromCharCode(0, 0, 0, n);

  test('accept without edits is one continue', () => {
    assert.deepEqual(replies({ kind: 'accept' }), ['c']);
  });

  test('deletes go in descending index order, once each, before the inserts; inserts keep their order', () => {
    const edits: HeaderEdits = {
      delete: [
        { name: 'Authentication-Results', index: 1 },
        { name: 'X-Spam', index: 2 },
        { name: 'Authentication-Results', index: 3 },
        { name: 'authentication-results', index: 1 },
      ],
      insert: [
        { index: 0, name: 'Authentication-Results', value: 'mx.svc.test;\r\n spf=pass' },
        { index: 1, name: 'X-Seen', value: 'yes\n\tand folded' },
      ],
    };
    assert.deepEqual(replies({ kind: 'accept' }, edits), [
      `m${index(3)}Authentication-Results\0\0`,
      `m${index(2)}X-Spam\0\0`,
      `m${index(1)}Authentication-Results\0\0`,
      `i${index(0)}Authentication-Results\0 mx.svc.test;\n spf=pass\0`,
      `i${index(1)}X-Seen\0 yes\n\tand folded\0`,
      'c',
    ]);
  });

  test('reject and defer become one replycode, % doubled', () => {
    assert.deepEqual(replies({ kind: 'reject', code: 555, dsn: '5.7.1', text: 'svc.test: 100% full' }), [
      'y555 5.7.1 svc.test: 100%% full\0',
    ]);
    assert.deepEqual(
      replies({ kind: 'defer', code: 451, dsn: '4.7.1', text: 'svc.test: sender not allowed' }),
      ['y451 4.7.1 svc.test: sender not allowed\0'],
    );
  });

  const bad: [string, Verdict, HeaderEdits?][] = [
    ['a defer with a 5xx code', { kind: 'defer', code: 550, dsn: '5.7.1', text: 'x' }],
    ['a reply class unlike the status class', { kind: 'reject', code: 550, dsn: '4.7.1', text: 'x' }],
    ['a text with a line break', { kind: 'reject', code: 550, dsn: '5.7.1', text: 'a\r\nb' }],
    [
      'a header name with a colon',
      { kind: 'accept' },
      { delete: [], insert: [{ index: 0, name: 'X:', value: 'v' }] },
    ],
    ['a delete index of 0', { kind: 'accept' }, { delete: [{ name: 'X', index: 0 }], insert: [] }],
  ];
  for (const [name, verdict, edits] of bad) {
    test(`refused: ${name}`, () => assert.throws(() => endOfMessageReply({ verdict, edits })));
  }
});
