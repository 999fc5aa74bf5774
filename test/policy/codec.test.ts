/**
 * codec - the policy wire format as tables: what Postfix sends becomes which request, which inputs are
 * refused, and which `action=` bytes each verdict becomes.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { Refusal, Verdict } from '../../src/core/verdict.ts';
import {
  encodeAction,
  MAX_ATTRIBUTES,
  MAX_LINE_BYTES,
  MAX_REQUEST_BYTES,
  PolicyProtocolError,
  PolicyRequestReader,
} from '../../src/policy/codec.ts';
import type { PolicyRequest } from '../../src/policy/handler.ts';

const RCPT = [
  'request=smtpd_access_policy',
  'protocol_state=RCPT',
  'protocol_name=ESMTP',
  'client_address=127.0.0.3',
  'client_name=mail.sender.test',
  'reverse_client_name=mail.sender.test',
  'helo_name=mail.sender.test',
  'sender=s@allowed.test',
  'recipient=good@svc.test',
  'recipient_count=0',
  'queue_id=',
  'instance=6717.6b016c6e.a2268.0',
  'size=1234',
  'sasl_method=',
  'stress=',
];

const read = (text: string | Buffer): PolicyRequest[] =>
  new PolicyRequestReader().push(Buffer.isBuffer(text) ? text : Buffer.from(text));
const one = (lines: string[]): PolicyRequest => {
  const requests = read(`${lines.join('\n')}\n\n`);
  assert.equal(requests.length, 1);
  return requests[0] as PolicyRequest;
};

describe('policy request decoding', () => {
  test('a RCPT request names every attribute the core reads', () => {
    const { attributes, ...request } = one(RCPT);
    assert.deepEqual(request, {
      protocolState: 'RCPT',
      instance: '6717.6b016c6e.a2268.0',
      clientAddress: '127.0.0.3',
      clientName: 'mail.sender.test',
      reverseClientName: 'mail.sender.test',
      heloName: 'mail.sender.test',
      sender: 's@allowed.test',
      recipient: 'good@svc.test',
      size: 1234,
      queueId: '',
    });
    assert.equal(attributes.size, RCPT.length);
    assert.equal(attributes.get('protocol_name'), 'ESMTP');
    assert.equal(attributes.get('stress'), '');
  });

  const cases: { name: string; lines: string[]; expect: Partial<PolicyRequest> }[] = [
    {
      name: 'a CONNECT request with only the always-present attributes fills the rest with empty forms',
      lines: ['request=smtpd_access_policy', 'protocol_state=CONNECT', 'client_address=127.0.0.2'],
      expect: {
        protocolState: 'CONNECT',
        instance: '',
        clientName: 'unknown',
        reverseClientName: 'unknown',
        heloName: '',
        sender: '',
        recipient: '',
        size: 0,
        queueId: '',
      },
    },
    {
      name: 'empty values stay empty and the null sender is the empty string',
      lines: ['request=smtpd_access_policy', 'sender=', 'helo_name=', 'client_name=', 'reverse_client_name='],
      expect: { sender: '', heloName: '', clientName: 'unknown', reverseClientName: 'unknown' },
    },
    {
      name: 'an unverified PTR name is kept apart from the verified name',
      lines: ['request=smtpd_access_policy', 'client_name=unknown', 'reverse_client_name=nofwd.sender.test'],
      expect: { clientName: 'unknown', reverseClientName: 'nofwd.sender.test' },
    },
    { name: 'size=0 is zero', lines: ['request=smtpd_access_policy', 'size=0'], expect: { size: 0 } },
    { name: 'size= is zero', lines: ['request=smtpd_access_policy', 'size='], expect: { size: 0 } },
    {
      name: 'a non-numeric size is zero',
      lines: ['request=smtpd_access_policy', 'size=12k'],
      expect: { size: 0 },
    },
    {
      name: 'a negative size is zero',
      lines: ['request=smtpd_access_policy', 'size=-5'],
      expect: { size: 0 },
    },
    {
      name: 'an end-of-message size is the actual size',
      lines: ['request=smtpd_access_policy', 'protocol_state=END-OF-MESSAGE', 'size=893'],
      expect: { protocolState: 'END-OF-MESSAGE', size: 893 },
    },
    {
      name: 'a size beyond exact integers stays huge, never zero',
      lines: ['request=smtpd_access_policy', 'size=123456789012345678901234567890'],
      expect: { size: Number.MAX_SAFE_INTEGER },
    },
    {
      name: 'a value may contain "=" and spaces',
      lines: ['request=smtpd_access_policy', 'sender=a=b c@x.test'],
      expect: { sender: 'a=b c@x.test' },
    },
    {
      name: 'attribute order is not significant',
      lines: ['recipient=r@svc.test', 'protocol_state=RCPT', 'request=smtpd_access_policy'],
      expect: { recipient: 'r@svc.test', protocolState: 'RCPT' },
    },
    {
      name: 'a repeated attribute takes its last value',
      lines: ['request=smtpd_access_policy', 'recipient=first@svc.test', 'recipient=last@svc.test'],
      expect: { recipient: 'last@svc.test' },
    },
    {
      name: 'UTF-8 addresses (SMTPUTF8) decode',
      lines: ['request=smtpd_access_policy', 'recipient=jürgen@svc.test'],
      expect: { recipient: 'jürgen@svc.test' },
    },
  ];
  for (const { name, lines, expect } of cases) {
    test(name, () => {
      const request = one(lines) as unknown as Record<string, unknown>;
      for (const [key, value] of Object.entries(expect)) assert.equal(request[key], value, key);
    });
  }

  test('unknown attributes are kept in attributes and change nothing else', () => {
    const plain = one(RCPT);
    const extra = one([...RCPT, 'x_future_attribute=42', 'policy_context=']);
    assert.equal(extra.attributes.get('x_future_attribute'), '42');
    assert.equal(extra.attributes.has('policy_context'), true);
    const { attributes: _a, ...withoutA } = plain;
    const { attributes: _b, ...withoutB } = extra;
    assert.deepEqual(withoutB, withoutA);
  });

  test('CRLF line ends decode like LF', () => {
    const crlf = read(`${RCPT.join('\r\n')}\r\n\r\n`);
    assert.equal(crlf.length, 1);
    assert.equal(crlf[0]?.recipient, 'good@svc.test');
    assert.equal(crlf[0]?.attributes.get('queue_id'), '');
    assert.equal(crlf[0]?.protocolState, 'RCPT');
  });

  test('two requests in one chunk come out in order', () => {
    const text = `${['request=smtpd_access_policy', 'recipient=a@svc.test'].join('\n')}\n\n`;
    const requests = read(text + text.replace('a@', 'b@'));
    assert.deepEqual(
      requests.map((r) => r.recipient),
      ['a@svc.test', 'b@svc.test'],
    );
  });

  test('a request split at every byte boundary decodes the same', () => {
    const bytes = Buffer.from(`${RCPT.join('\r\n')}\r\n\r\n`);
    for (let cut = 1; cut < bytes.length; cut++) {
      const reader = new PolicyRequestReader();
      const requests = [...reader.push(bytes.subarray(0, cut)), ...reader.push(bytes.subarray(cut))];
      assert.equal(requests.length, 1, `cut at ${cut}`);
      assert.equal(requests[0]?.instance, '6717.6b016c6e.a2268.0', `cut at ${cut}`);
    }
  });

  test('an unfinished request yields nothing yet', () => {
    const reader = new PolicyRequestReader();
    assert.deepEqual(reader.push(Buffer.from('request=smtpd_access_policy\nrecipient=a@svc.test\n')), []);
    assert.equal(reader.push(Buffer.from('\n')).length, 1);
  });
});

describe('policy request bounds and syntax', () => {
  const line = (bytes: number) => `x=${'a'.repeat(bytes - 2)}`;
  const accepted: { name: string; input: string }[] = [
    {
      name: `a line of exactly ${MAX_LINE_BYTES} bytes`,
      input: `request=smtpd_access_policy\n${line(MAX_LINE_BYTES)}\n\n`,
    },
    {
      name: `a line of ${MAX_LINE_BYTES} bytes plus CR`,
      input: `request=smtpd_access_policy\r\n${line(MAX_LINE_BYTES)}\r\n\r\n`,
    },
    {
      name: `exactly ${MAX_ATTRIBUTES} attributes`,
      input: `request=smtpd_access_policy\n${Array.from({ length: MAX_ATTRIBUTES - 1 }, (_, i) => `a${i}=`).join('\n')}\n\n`,
    },
  ];
  for (const { name, input } of accepted) {
    test(`${name} is accepted`, () => assert.equal(read(input).length, 1));
  }

  const refused: { name: string; input: string | Buffer; reason: RegExp }[] = [
    { name: 'a line without "="', input: 'request=smtpd_access_policy\ngarbage\n\n', reason: /without "="/ },
    {
      name: 'an empty attribute name',
      input: 'request=smtpd_access_policy\n=value\n\n',
      reason: /empty attribute name/,
    },
    { name: 'a request without request=', input: 'protocol_state=RCPT\n\n', reason: /no request attribute/ },
    { name: 'an empty request', input: '\n', reason: /no request attribute/ },
    { name: 'another request type', input: 'request=other_policy\n\n', reason: /unknown request type/ },
    {
      name: `a line of ${MAX_LINE_BYTES + 1} bytes`,
      input: `request=smtpd_access_policy\n${line(MAX_LINE_BYTES + 1)}\n\n`,
      reason: /line too long/,
    },
    {
      name: 'an endless line before its LF arrives',
      input: `request=smtpd_access_policy\n${line(MAX_LINE_BYTES + 2)}`,
      reason: /line too long/,
    },
    {
      name: `${MAX_ATTRIBUTES + 1} attributes`,
      input: `request=smtpd_access_policy\n${Array.from({ length: MAX_ATTRIBUTES }, (_, i) => `a${i}=`).join('\n')}\n\n`,
      reason: /too many attributes/,
    },
    {
      name: `a request over ${MAX_REQUEST_BYTES} bytes`,
      input: `request=smtpd_access_policy\n${Array.from({ length: 9 }, () => line(8000)).join('\n')}\n\n`,
      reason: /request too large/,
    },
    {
      name: `a request over ${MAX_REQUEST_BYTES} bytes before its end arrives`,
      input: `${Array.from({ length: 8 }, () => line(8000)).join('\n')}\n${line(8000)}`,
      reason: /request too large/,
    },
  ];
  for (const { name, input, reason } of refused) {
    test(`${name} is a protocol error`, () => {
      assert.throws(
        () => read(input),
        (error: unknown) => error instanceof PolicyProtocolError && reason.test(error.message),
      );
    });
  }
});

describe('policy reply encoding', () => {
  const replies: { verdict: Verdict; wire: string }[] = [
    { verdict: { kind: 'accept' }, wire: 'action=DUNNO\n\n' },
    {
      verdict: { kind: 'reject', code: 555, dsn: '5.7.1', text: 'svc: no such inbox' },
      wire: 'action=555 5.7.1 svc: no such inbox\n\n',
    },
    {
      verdict: { kind: 'defer', code: 451, dsn: '4.7.1', text: 'svc: try later' },
      wire: 'action=451 4.7.1 svc: try later\n\n',
    },
    {
      verdict: { kind: 'reject', code: 550, dsn: '5.7.1', text: 'two\r\nlines\nand\rmore' },
      wire: 'action=550 5.7.1 two lines and more\n\n',
    },
  ];
  for (const { verdict, wire } of replies) {
    test(`${verdict.kind} is sent as ${JSON.stringify(wire)}`, () =>
      assert.equal(encodeAction(verdict), wire));
  }

  const invalid: Refusal[] = [
    { kind: 'reject', code: 451, dsn: '4.7.1', text: 'a reject with a 4xx code' },
    { kind: 'defer', code: 550, dsn: '5.7.1', text: 'a defer with a 5xx code' },
    { kind: 'reject', code: 550, dsn: '4.7.1', text: 'a DSN of the wrong class' },
    { kind: 'reject', code: 550, dsn: '5.7', text: 'a malformed DSN' },
  ];
  for (const verdict of invalid) {
    test(`${verdict.text} is refused rather than sent`, () => assert.throws(() => encodeAction(verdict)));
  }
});
