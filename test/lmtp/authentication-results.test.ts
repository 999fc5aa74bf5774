/**
 * authentication-results: the `authentication` object read from our own Authentication-Results field
 * (contract section 2; DESIGN decision 6; RFC 8601 section 2.2). Table tests over hand-written fields,
 * and over fields mailauth itself writes for pass, fail and none, with a fake DNS (MAIL-FACTS E.3).
 */
import assert from 'node:assert/strict';
import { generateKeyPairSync } from 'node:crypto';
import { test } from 'node:test';
import { authenticate, dkimSign } from 'mailauth';
import {
  claimsAuthservId,
  MAX_FIELD_CHARS,
  parseAuthenticationResults,
  readAuthentication,
} from '../../src/core/authentication-results.ts';
import type { Authentication } from '../../src/core/model.ts';

const ID = 'mx.svc.test';
const BODY = 'From: S <s@allowed.test>\r\nSubject: hi\r\n\r\nbody\r\n';
const read = (field: string, rest = BODY) =>
  readAuthentication(Buffer.from(`Authentication-Results: ${field}\r\n${rest}`), ID);

type R = [string, string | null];
const auth = (dmarc: R, dkim: R, spf: R): Authentication => ({
  dmarc: { result: dmarc[0], domain: dmarc[1] },
  dkim: { result: dkim[0], domain: dkim[1] },
  spf: { result: spf[0], domain: spf[1] },
});
const NONE: R = ['none', null];

/** The milter's field as MAIL-FACTS E.4 records it. */
const OBSERVED = `mx.svc.test;\r\n dkim=pass header.i=@allowed.test header.s=sel header.a=rsa-sha256 header.b=PByekjoH;\r\n spf=pass (mx.svc.test: domain of s@allowed.test designates 127.0.0.3 as permitted sender) smtp.mailfrom=s@allowed.test smtp.helo=mail.sender.test;\r\n dmarc=pass (p=REJECT arc=none) header.from=allowed.test header.d=allowed.test`;

const CASES: [string, string, Authentication | null][] = [
  [
    'ASCII names as written: no percent-decoding, no numbers read as addresses',
    'mx.svc.test; dkim=pass header.d=%61llowed.test; spf=pass smtp.mailfrom=s@2130706433; dmarc=fail header.from=allowed.test',
    auth(['fail', 'allowed.test'], ['pass', '%61llowed.test'], ['pass', '2130706433']),
  ],
  [
    'internationalized domains in their ASCII (xn--) form, as DMARC and sender_domains have them',
    'mx.svc.test; dkim=pass header.d=\u00e9vil.test; spf=pass smtp.mailfrom=\u00fc@\u00c9vil.test; dmarc=pass header.from=xn--vil-9la.test',
    auth(['pass', 'xn--vil-9la.test'], ['pass', 'xn--vil-9la.test'], ['pass', 'xn--vil-9la.test']),
  ],
  [
    'the field our milter writes',
    OBSERVED,
    auth(['pass', 'allowed.test'], ['pass', 'allowed.test'], ['pass', 'allowed.test']),
  ],
  [
    'a DKIM pass aligned with From: wins over an earlier unaligned pass',
    `${ID}; dkim=pass header.d=esp.example; dkim=pass header.d=mail.brand.example; dmarc=pass header.from=brand.example`,
    auth(['pass', 'brand.example'], ['pass', 'mail.brand.example'], NONE),
  ],
  [
    'no aligned pass: the first pass',
    `${ID}; dkim=fail header.d=brand.example; dkim=pass header.d=esp.example; dkim=pass header.d=other.example; dmarc=fail header.from=brand.example`,
    auth(['fail', 'brand.example'], ['pass', 'esp.example'], NONE),
  ],
  [
    'no pass: the first DKIM result; header.i gives the domain when header.d is absent',
    `${ID}; dkim=neutral (body hash did not verify) header.i=user@Sub.Example.ORG; dkim=fail header.d=x.example`,
    auth(NONE, ['neutral', 'sub.example.org'], NONE),
  ],
  [
    'no DKIM, DMARC or SPF result: each is none with a null domain',
    `${ID}; arc=none smtp.remote-ip=127.0.0.3`,
    auth(NONE, NONE, NONE),
  ],
  ['`; none` means no results', `${ID}; none`, auth(NONE, NONE, NONE)],
  [
    'domains as the lists hold them: trailing dots dropped',
    `${ID}; dmarc=pass header.from=Allowed.Test..; spf=pass smtp.mailfrom=s@allowed.test.`,
    auth(['pass', 'allowed.test'], NONE, ['pass', 'allowed.test']),
  ],
  ['an authserv-id alone', `${ID}`, auth(NONE, NONE, NONE)],
  [
    'SPF domain: a bare domain in smtp.mailfrom, else smtp.helo',
    `${ID}; spf=none smtp.helo=Mail.Sender.Test; spf=pass smtp.mailfrom=ignored.test`,
    auth(NONE, NONE, ['none', 'mail.sender.test']),
  ],
  [
    'SPF domain from a quoted local part with specials',
    `${ID}; spf=pass (domain of "a\\)b;c"@allowed.test) smtp.mailfrom="\\"a)b;c\\"@Allowed.Test" smtp.helo=h.test`,
    auth(NONE, NONE, ['pass', 'allowed.test']),
  ],
  [
    'methods and results are case-insensitive and lowercased; a method version is dropped',
    `MX.SVC.TEST 1; DKIM/1=PASS Header.D=allowed.test; SPF = SoftFail smtp.mailfrom = x@Allowed.test; DMARC=Pass header.from=Allowed.Test`,
    auth(['pass', 'allowed.test'], ['pass', 'allowed.test'], ['softfail', 'allowed.test']),
  ],
  [
    'nested comments with escapes and CFWS around the authserv-id',
    `(first (nested \\) paren) comment) mx.svc.test (x);\r\n\tdkim=pass (good (very) "sig") header.d=allowed.test reason="a; (b)"`,
    auth(NONE, ['pass', 'allowed.test'], NONE),
  ],
  [
    'an unquoted base64 value with + / = characters',
    `${ID}; dkim=pass header.d=a.test header.b=ab+/c=; dmarc=pass header.from=a.test`,
    auth(['pass', 'a.test'], ['pass', 'a.test'], NONE),
  ],
  [
    'a quoted authserv-id',
    `" MX.svc.test " ; dmarc=pass header.from=a.test`,
    auth(['pass', 'a.test'], NONE, NONE),
  ],
  ['another authserv-id: null', `mx.forged.test; dmarc=pass header.from=allowed.test`, null],
  ['an authserv-id that only starts like ours: null', `mx.svc.test.evil; dmarc=pass`, null],
  ['unterminated comment: null', `${ID}; dkim=pass (oops header.d=a.test`, null],
  ['unterminated quoted string: null', `${ID}; dkim=pass reason="oops`, null],
  ['a stray closing parenthesis: null', `${ID}; dkim=pass) header.d=a.test`, null],
  ['a method without a result: null', `${ID}; dkim pass header.d=a.test`, null],
  ['a property without a value: null', `${ID}; dkim=pass header.d=`, null],
  ['an empty field: null', ``, null],
  ['a version that is not a number: null', `${ID} v2; dkim=pass`, null],
];

test("authentication: without smtp.mailfrom (mailauth drops a value over 900 bytes) SPF names the envelope sender's domain; the HELO name only for the null sender, and never an address literal", () => {
  const field = (helo: string) =>
    Buffer.from(`Authentication-Results: ${ID}; spf=pass smtp.helo=${helo}\r\n${BODY}`);
  const spf = (helo: string, envelopeFrom: string) => readAuthentication(field(helo), ID, envelopeFrom)?.spf;
  assert.deepEqual(spf('bank.test', `${'a'.repeat(950)}@Allowed.Test`), {
    result: 'pass',
    domain: 'allowed.test',
  });
  assert.deepEqual(spf('bank.test', ''), { result: 'pass', domain: 'bank.test' });
  assert.deepEqual(spf('[127.0.0.3]', ''), { result: 'pass', domain: null });
  assert.deepEqual(spf('127.0.0.3', ''), { result: 'pass', domain: null });
  const literal = readAuthentication(
    Buffer.from(`Authentication-Results: ${ID}; spf=none smtp.mailfrom=postmaster@[127.0.0.3]\r\n${BODY}`),
    ID,
    '',
  );
  assert.deepEqual(literal?.spf, { result: 'none', domain: null });
});

for (const [name, field, expected] of CASES) {
  test(`authentication: ${name}`, () => {
    assert.deepEqual(read(field), expected);
  });
}

test('claimsAuthservId: the first word or quoted string, after comments; nothing after it is read', () => {
  // Field values as the milter has them: their bytes as latin1 characters.
  const bytes = (text: string) => Buffer.from(text, 'utf8').toString('latin1');
  const table: [string, boolean][] = [
    [' mx.svc.test; dmarc=pass', true],
    [' (x) MX.SVC.TEST; dmarc=pass', true],
    [' mx.svc.test(trailing comment);spf=pass', true],
    ['\n\tmx.svc.test 1; dkim=pass', true],
    [' " mx.svc.test "; dmarc=pass', true],
    [' mx.svc.test; dmarc=pass (unterminated', true],
    // Read generously: what a lenient reader could take for our id is ours to remove.
    [bytes(' \u00a0mx.svc.test; dmarc=pass'), true],
    [bytes(' \ufeffmx.svc.test; dmarc=pass'), true],
    [bytes(' mx.svc.test\u3000; dmarc=pass'), true],
    [bytes(' "mx.svc.test\u00a0"; dmarc=pass'), true],
    [bytes(' mx\u200b.svc.test; dmarc=pass'), true],
    [bytes(' \uff4d\uff58.svc.test; dmarc=pass'), true],
    [' \xa0mx.svc.test; dmarc=pass', true],
    // As a domain name: with a trailing dot it is the same name.
    [' mx.svc.test.; dmarc=pass', true],
    [` ${'\ufdfa'.repeat(27_000)}; dmarc=pass`, false],
    [' mx.svc.test/1; dmarc=pass', false],
    [' other.example; dmarc=pass', false],
    [' ; dmarc=pass', false],
    [' (only a comment)', false],
    [' (unterminated', false],
  ];
  for (const [value, expected] of table)
    assert.equal(claimsAuthservId(value, ID), expected, JSON.stringify(value));
  // An IDN id (the default mx.MAIL_DOMAIN of an IDN mail domain) claimed in its Unicode spelling.
  const idn = 'mx.xn--bcher-kva.example';
  for (const value of [
    ' mx.bücher.example; dmarc=pass',
    ' mx.BÜCHER.example; dmarc=pass',
    ` ${idn}.; dmarc=pass`,
  ])
    assert.equal(claimsAuthservId(bytes(value), idn), true, value);
  assert.equal(claimsAuthservId(bytes(' mx.bucher.example; dmarc=pass'), idn), false);
});

test('authentication: an id with Unicode white space around it is not ours to the receiver', () => {
  for (const space of ['\u00a0', '\ufeff', '\u3000']) {
    const head = `Authentication-Results: ${space}${OBSERVED.trimStart()}\r\n${BODY}`;
    assert.equal(readAuthentication(Buffer.from(head, 'utf8'), ID), null, JSON.stringify(space));
    const quoted = `Authentication-Results: "${ID}${space}"; dmarc=pass header.from=x.test\r\n${BODY}`;
    assert.equal(readAuthentication(Buffer.from(quoted, 'utf8'), ID), null, JSON.stringify(space));
  }
});

test('authentication: our field below the first header field does not count', () => {
  const head = `Received: from x by y; Mon, 1 Jan 2024 00:00:00 +0000\r\nAuthentication-Results: ${OBSERVED}\r\n${BODY}`;
  assert.equal(readAuthentication(Buffer.from(head), ID), null);
});

test('authentication: no header at all, or a body that looks like one, gives null', () => {
  assert.equal(readAuthentication(Buffer.from(`\r\nAuthentication-Results: ${OBSERVED}\r\n`), ID), null);
  assert.equal(readAuthentication(Buffer.from(''), ID), null);
});

test('authentication: the authserv-id is compared case-insensitively, and the field name too', () => {
  const head = Buffer.from(`authentication-RESULTS: MX.Svc.Test; dmarc=pass header.from=a.test\r\n\r\n`);
  assert.deepEqual(readAuthentication(head, 'mx.svc.TEST'), auth(['pass', 'a.test'], NONE, NONE));
});

test('authentication: a field longer than MAX_FIELD_CHARS is unreadable', () => {
  const long = `${ID}; dmarc=pass header.from=a.test (${'x'.repeat(MAX_FIELD_CHARS)})`;
  assert.equal(read(long), null);
});

test('parseAuthenticationResults keeps reason and properties per result', () => {
  const parsed = parseAuthenticationResults(` ${ID}; dkim=fail reason="bad sig" header.d=a.test policy.x=1`);
  assert.equal(parsed?.authservId, ID);
  assert.equal(parsed?.results.length, 1);
  const [result] = parsed?.results ?? [];
  assert.equal(result?.reason, 'bad sig');
  assert.deepEqual(
    [...(result?.properties ?? [])],
    [
      ['header.d', 'a.test'],
      ['policy.x', '1'],
    ],
  );
});

// ---- fields written by mailauth itself -------------------------------------------------------------

const { privateKey, publicKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
const pem = privateKey.export({ type: 'pkcs8', format: 'pem' }) as string;
const DNS: Record<string, Record<string, string[][]>> = {
  'allowed.test': { TXT: [['v=spf1 ip4:127.0.0.0/8 -all']] },
  '_dmarc.allowed.test': { TXT: [['v=DMARC1; p=reject']] },
  'sel._domainkey.allowed.test': {
    TXT: [[`v=DKIM1; k=rsa; p=${publicKey.export({ type: 'spki', format: 'der' }).toString('base64')}`]],
  },
  'strict.test': { TXT: [['v=spf1 ip4:10.0.0.1 -all']] },
  '_dmarc.strict.test': { TXT: [['v=DMARC1; p=reject']] },
  'lax.test': { TXT: [['v=spf1 ?all']] },
  '_dmarc.lax.test': { TXT: [['v=DMARC1; p=none']] },
};
/** Behaves like dns.promises.resolve over DNS; an unknown name throws ENOTFOUND (MAIL-FACTS E.3). */
const resolver = async (name: string, rrtype: string) => {
  const answer = DNS[name.toLowerCase()]?.[rrtype];
  if (answer) return answer;
  throw Object.assign(new Error(`queryTxt ENOTFOUND ${name}`), { code: 'ENOTFOUND' });
};

const message = (domain: string) =>
  `From: S <s@${domain}>\r\nTo: x@inbox.test\r\nSubject: hi\r\nMessage-ID: <1@${domain}>\r\n\r\nbody\r\n`;

async function signed(raw: string): Promise<string> {
  const key = { signingDomain: 'allowed.test', selector: 'sel', privateKey: pem };
  const result = await dkimSign(raw, { ...key, signatureData: [key] });
  return result.signatures + raw;
}

/** The message as our milter stores it: mailauth's Authentication-Results field on top. */
async function withMailauthField(raw: string, sender: string, strict: boolean): Promise<Buffer> {
  const result = await authenticate(Buffer.from(raw), {
    ip: '127.0.0.3',
    helo: 'mail.sender.test',
    sender,
    mta: ID,
    resolver,
    strict,
  });
  const field = /^Authentication-Results:.*\r\n(?:[ \t].*\r\n)*/m.exec(result.headers)?.[0];
  assert.ok(field, result.headers);
  return Buffer.from(field + raw);
}

const MAILAUTH_CASES: [string, () => Promise<string>, string, Authentication][] = [
  [
    'signed, SPF pass, DMARC pass',
    () => signed(message('allowed.test')),
    's@allowed.test',
    auth(['pass', 'allowed.test'], ['pass', 'allowed.test'], ['pass', 'allowed.test']),
  ],
  [
    'a broken signature',
    async () => (await signed(message('allowed.test'))).replace('body', 'b0dy'),
    's@allowed.test',
    auth(['pass', 'allowed.test'], ['neutral', 'allowed.test'], ['pass', 'allowed.test']),
  ],
  [
    'unsigned, SPF fail, DMARC fail',
    async () => message('strict.test'),
    's@strict.test',
    auth(['fail', 'strict.test'], NONE, ['fail', 'strict.test']),
  ],
  [
    'unsigned, SPF neutral, DMARC fail with p=none',
    async () => message('lax.test'),
    's@lax.test',
    auth(['fail', 'lax.test'], NONE, ['neutral', 'lax.test']),
  ],
  [
    'the null sender: SPF checks postmaster@HELO',
    async () => message('lax.test'),
    '',
    auth(['fail', 'lax.test'], NONE, ['none', 'mail.sender.test']),
  ],
];

for (const [name, make, sender, expected] of MAILAUTH_CASES) {
  for (const strict of [false, true]) {
    test(`authentication from mailauth (${strict ? 'strict' : 'default'} mode): ${name}`, async () => {
      const stored = await withMailauthField(await make(), sender, strict);
      const got = readAuthentication(stored, ID);
      // strict mode reports a bad body hash as fail, the default mode as neutral (mailauth's docs)
      const want =
        strict && expected.dkim.result === 'neutral'
          ? { ...expected, dkim: { ...expected.dkim, result: 'fail' } }
          : expected;
      assert.deepEqual(got, want, stored.toString().split('\r\n\r\n')[0]);
    });
  }
}

test('authentication from mailauth under another authserv-id is null', async () => {
  const stored = await withMailauthField(await signed(message('allowed.test')), 's@allowed.test', false);
  assert.equal(readAuthentication(stored, 'mx.other.test'), null);
});
