/**
 * message-summary: the poll's `from`, `subject` and `internet_message_id` read from a header block
 * (contract section 2 "Message summary"). Pure table tests.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  headerBlockLength,
  headerFields,
  MAX_FIELD_CHARS,
  type MessageSummary,
  summarizeMessage,
} from '../../src/core/message-summary.ts';

const summary = (
  fromName: string | null,
  fromAddress: string | null,
  subject: string | null = null,
  internetMessageId: string | null = null,
): MessageSummary => ({ fromName, fromAddress, subject, internetMessageId });

const CASES: [string, string | Buffer, string, MessageSummary][] = [
  [
    'a display name and an address',
    'From: Ada Lovelace <ada@example.org>\r\nSubject: Hello\r\nMessage-ID: <a.1@example.org>\r\n\r\nbody\r\n',
    'bounce@example.org',
    summary('Ada Lovelace', 'ada@example.org', 'Hello', '<a.1@example.org>'),
  ],
  [
    'an RFC 2047 Q-encoded name and a B-encoded subject',
    'From: =?UTF-8?Q?Ada_Lovel=C3=A6ce?= <ada@example.org>\r\nSubject: =?UTF-8?B?R3LDvMOfZQ==?=\r\n\r\n',
    's@x.test',
    summary('Ada Lovelæce', 'ada@example.org', 'Grüße'),
  ],
  [
    'a quoted name with a comma',
    'From: "Lovelace, Ada" <ada@example.org>\r\n\r\n',
    's@x.test',
    summary('Lovelace, Ada', 'ada@example.org'),
  ],
  [
    'raw UTF-8 (SMTPUTF8) name, address and subject',
    'From: Jürgen Groß <jürgen@bücher.example>\r\nSubject: Größe 日本\r\n\r\n',
    's@x.test',
    summary('Jürgen Groß', 'jürgen@bücher.example', 'Größe 日本'),
  ],
  ['an address only', 'From: ada@example.org\r\n\r\n', 's@x.test', summary(null, 'ada@example.org')],
  [
    'the first mailbox of a list, groups looked into',
    'From: Team: ada@example.org, bob@example.org;\r\n\r\n',
    's@x.test',
    summary(null, 'ada@example.org'),
  ],
  [
    'no From: the envelope sender, name null',
    'Subject: x\r\n\r\n',
    'bounce@example.org',
    summary(null, 'bounce@example.org', 'x'),
  ],
  ['no From and the null sender: both null', 'Subject: x\r\n\r\n', '', summary(null, null, 'x')],
  ['an empty From: like a missing one', 'From:  \r\n\r\n', 'b@example.org', summary(null, 'b@example.org')],
  [
    'a From without an address keeps its name',
    'From: undisclosed\r\n\r\n',
    'b@example.org',
    summary('undisclosed', null),
  ],
  [
    'folded fields are unfolded; adjacent encoded words join',
    'Subject: =?UTF-8?Q?Gr=C3=BC?=\r\n =?UTF-8?Q?=C3=9Fe?= aus\r\n\tBerlin\r\nMessage-ID:\r\n <folded@example.org>\r\n\r\n',
    's@x.test',
    summary(null, 's@x.test', 'Grüße aus\tBerlin', '<folded@example.org>'),
  ],
  [
    // RFC 2047 wants each B word padded; senders that leave it out still mean each word on its own
    'adjacent B-encoded words without their padding decode each whole',
    'From: =?utf-8?B?w6Q?= =?utf-8?B?w7Y?= <a@example.org>\r\nSubject: =?utf-8?B?YQ?= =?utf-8?B?Yg?=\r\n\r\n',
    '',
    summary('äö', 'a@example.org', 'ab'),
  ],
  ['an empty subject is an empty string', 'Subject:\r\n\r\n', '', summary(null, null, '')],
  [
    'names are case-insensitive; the first of repeated fields wins',
    'FROM: First <first@example.org>\r\nfrom: Second <second@example.org>\r\nsubject: one\r\nSubject: two\r\n\r\n',
    '',
    summary('First', 'first@example.org', 'one'),
  ],
  [
    'fields after the blank line are body',
    'Subject: real\r\n\r\nFrom: body@example.org\r\nMessage-ID: <body@x>\r\n',
    's@x.test',
    summary(null, 's@x.test', 'real'),
  ],
  [
    'LF-only line endings',
    'From: Ada <ada@example.org>\nSubject: lf\n folded\n\nFrom: body@example.org\n',
    '',
    summary('Ada', 'ada@example.org', 'lf folded'),
  ],
  [
    'Latin-1 letters that are not UTF-8',
    Buffer.concat([Buffer.from('Subject: caf'), Buffer.from([0xe9]), Buffer.from('\r\n\r\n')]),
    '',
    summary(null, null, 'café'),
  ],
  [
    'bytes that are not UTF-8 read as windows-1252 (quotes and the euro sign, not C1 controls)',
    Buffer.concat([
      Buffer.from('Subject: '),
      Buffer.from([0x93]),
      Buffer.from('Reset'),
      Buffer.from([0x94, 0x20, 0x80]),
      Buffer.from('5\r\n\r\n'),
    ]),
    '',
    summary(null, null, '\u201cReset\u201d \u20ac5'),
  ],
  [
    'a decoded line break or other control character becomes a space',
    'Subject: =?UTF-8?Q?a=0D=0AX-Injected:_1?= b\x01c\x1bd\r\n\r\n',
    '',
    summary(null, null, 'a  X-Injected: 1 b c d'),
  ],
  [
    'C1 controls and Unicode line separators become spaces, raw, encoded or left by windows-1252',
    Buffer.concat([
      Buffer.from('Subject: a\u0085b\u2028c\u2029d =?UTF-8?Q?e=C2=85f?=\r\nX-Latin: '),
      Buffer.from('\r\nFrom: g'),
      Buffer.from([0x81, 0x9d, 0xe9]),
      Buffer.from(' <g@example.org>\r\n\r\n'),
    ]),
    '',
    summary('g  \u00e9', 'g@example.org', 'a b c d e f'),
  ],
  [
    'an obsolete source route is not part of the address',
    'From: Ada <@relay.test,@other.test:ada@example.org>\r\n\r\n',
    '',
    summary('Ada', 'ada@example.org'),
  ],
  [
    'NUL characters are dropped',
    'Subject: a\0b\r\nMessage-ID: <x\0y@z>\r\n\r\n',
    '',
    summary(null, null, 'ab', '<xy@z>'),
  ],
  [
    // libmime is lenient: an unknown charset passes the bytes through, bad base64 decodes to nothing
    'a malformed encoded word decodes leniently, never throws',
    'Subject: =?x-unknown?Q?abc?= =?UTF-8?B?###?=\r\n\r\n',
    '',
    summary(null, null, 'abc'),
  ],
  [
    'a line that is not a field is skipped',
    'garbage line\r\nSubject: kept\r\n\r\n',
    '',
    summary(null, null, 'kept'),
  ],
  ['a message without headers', '\r\nFrom: body@example.org\r\n', 'e@x.test', summary(null, 'e@x.test')],
];

for (const [name, head, envelopeFrom, expected] of CASES) {
  test(`summary: ${name}`, () => {
    const bytes = typeof head === 'string' ? Buffer.from(head) : head;
    assert.deepEqual(summarizeMessage(bytes, envelopeFrom), expected);
  });
}

test('summary: a subject longer than MAX_FIELD_CHARS is cut there', () => {
  const long = 'x'.repeat(MAX_FIELD_CHARS + 100);
  const result = summarizeMessage(Buffer.from(`Subject: ${long}\r\n\r\n`), '');
  assert.equal(result.subject, 'x'.repeat(MAX_FIELD_CHARS));
});

test('summary: only the first maxHeaderBytes of the header block are read', () => {
  const padding = `X-Pad: ${'p'.repeat(1000)}\r\n`.repeat(10);
  const head = Buffer.from(`${padding}Subject: late\r\n\r\n`);
  assert.equal(summarizeMessage(head, '', 20_000).subject, 'late');
  assert.equal(summarizeMessage(head, '', 5_000).subject, null);
});

test('headerBlockLength finds CRLF CRLF, LF LF, a leading blank line, or nothing', () => {
  assert.equal(headerBlockLength(Buffer.from('A: b\r\n\r\nbody')), 8);
  assert.equal(headerBlockLength(Buffer.from('A: b\n\nbody')), 6);
  assert.equal(headerBlockLength(Buffer.from('\r\nbody')), 2);
  assert.equal(headerBlockLength(Buffer.from('A: b\r\nC: d\r\n')), -1);
  // searching on from where the previous search stopped still finds an end split across pieces
  assert.equal(headerBlockLength(Buffer.from('A: b\r\n\r\n'), 7), 8);
});

test('headerFields keeps names as written and values unfolded', () => {
  assert.deepEqual(headerFields(Buffer.from('X-A : one\r\n two\r\nX-B:three\r\n\r\nX-C: body\r\n')), [
    { name: 'X-A', value: ' one two' },
    { name: 'X-B', value: 'three' },
  ]);
});
