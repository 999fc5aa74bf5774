/**
 * MailauthAuthenticator and the domains a reader sees: a `From:` domain is checked in the form a mail
 * reader shows it (UTS-46: A-labels, invisible characters dropped, full-width letters folded), and a
 * DKIM `d=` written in Unicode is matched against the author in its A-label form. DNS from a table.
 */
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { test } from 'node:test';
import type { AuthVerdict } from '../../src/core/ports.ts';
import type { CachingLookup } from '../../src/mail/dns.ts';
import { MailauthAuthenticator } from '../../src/mail/mailauth-authenticator.ts';

const TXT: Record<string, string> = {
  '_dmarc.strict.test': 'v=DMARC1; p=reject',
  '_dmarc.xn--bcher-kva.example': 'v=DMARC1; p=reject',
  'lax.test': 'v=spf1 ?all',
};

/** The table above; a DKIM key lookup fails as a broken server would (SERVFAIL), the rest is not found. */
async function resolve(name: string, rrtype: string): Promise<string[][] | string[]> {
  if (name.includes('._domainkey.'))
    throw Object.assign(new Error(`queryTxt ESERVFAIL ${name}`), { code: 'ESERVFAIL' });
  const text = rrtype === 'TXT' ? TXT[name.toLowerCase()] : undefined;
  if (text) return [[text]];
  throw Object.assign(new Error(`queryTxt ENOTFOUND ${name}`), { code: 'ENOTFOUND' });
}

/** The body below ("body" and CRLF) hashed as relaxed canonicalization leaves it (RFC 6376 3.4.4). */
const BODY_HASH = createHash('sha256').update('body\r\n').digest('base64');

const authenticator = new MailauthAuthenticator('mx.svc.test', { resolve } as unknown as CachingLookup);

function verdict(head: string): Promise<AuthVerdict> {
  return authenticator.authenticate({
    message: (async function* () {
      yield Buffer.from(`${head}To: x@svc.test\r\nSubject: hi\r\n\r\nbody\r\n`, 'utf8');
    })(),
    clientAddress: '127.0.0.3',
    helo: 'mail.sender.test',
    envelopeFrom: 'x@lax.test',
  });
}

test('a From: domain a reader shows as a p=reject domain is not taken for another one', async () => {
  const plain = await verdict('From: ceo@strict.test\r\n');
  assert.deepEqual(plain.dmarc, { result: 'fail', policy: 'reject' });
  for (const domain of [
    'str\u00adict.test',
    'strict.test\u200b',
    '\uff53\uff54\uff52\uff49\uff43\uff54.test',
  ]) {
    const shown = await verdict(`From: ceo@${domain}\r\n`);
    assert.equal(shown.unverifiableAuthor, true, JSON.stringify(domain));
    assert.ok(shown.authorDomains?.includes('strict.test'), JSON.stringify(shown.authorDomains));
  }
  // A mailbox whose domain mailauth cannot use (a stray `>` or backslash; a reader may still show
  // strict.test), alone or beside another author: DMARC was skipped for it, and it got through.
  for (const from of ['ceo@strict.test>', 'ceo@strict.test\\', 'x@lax.test, ceo@strict.test>']) {
    const broken = await verdict(`From: ${from}\r\n`);
    assert.equal(broken.unverifiableAuthor, true, from);
  }
  // The same name in another case, with a trailing dot or as its A-label is what mailauth checked.
  for (const from of [
    'ceo@Strict.TEST',
    'ceo@strict.test.',
    'ceo@ strict.test',
    'CEO <ceo @ strict.test>',
    '"ceo@bank.example"@strict.test',
    'x@b\u00fccher.example',
    'x@xn--bcher-kva.example',
  ]) {
    const same = await verdict(`From: ${from}\r\n`);
    assert.equal(same.unverifiableAuthor, undefined, from);
    assert.deepEqual(same.dmarc, { result: 'fail', policy: 'reject' }, from);
  }
});

test('a DKIM d= in Unicode whose key lookup failed makes a p=reject failure temporary, as its A-label does', async () => {
  for (const d of ['xn--bcher-kva.example', 'b\u00fccher.example']) {
    const signature =
      `DKIM-Signature: v=1; a=rsa-sha256; c=relaxed/relaxed; d=${d}; s=sel; h=from:subject;\r\n` +
      ` bh=${BODY_HASH}; b=AAAA\r\n`;
    const result = await verdict(`${signature}From: x@b\u00fccher.example\r\n`);
    assert.deepEqual(result.dmarc, { result: 'fail', policy: 'reject' }, d);
    assert.equal(result.lookupFailed, true, d);
  }
});
