/**
 * MailauthAuthenticator.readsBody: which messages the milter may authenticate from their header block
 * alone. The rule (a DKIM-Signature or an ARC-* field means yes) is checked against mailauth itself:
 * every unsigned message below gets the same verdict, Authentication-Results text included, with and
 * without its body, and a signed one does not (its body hash would fail). DNS is the end-to-end
 * suite's zone (test/support/dns-zone.ts), answered without a server (MAIL-FACTS E.3).
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { AuthVerdict } from '../../src/core/ports.ts';
import type { CachingLookup } from '../../src/mail/dns.ts';
import { MailauthAuthenticator } from '../../src/mail/mailauth-authenticator.ts';
import { dkimSignFor, resolveInZone } from '../support/dns-zone.ts';

const lookup = { resolve: resolveInZone } as unknown as CachingLookup;
const authenticator = new MailauthAuthenticator('mx.svc.test', lookup);

/** The header block (up to and with the empty line) and the field names in it. */
function split(raw: string): { head: string; names: string[] } {
  const end = raw.indexOf('\r\n\r\n') + 4;
  const head = raw.slice(0, end);
  const names = head
    .split('\r\n')
    .filter((line) => line !== '' && !/^[ \t]/.test(line))
    .map((line) => line.slice(0, line.indexOf(':')));
  return { head, names };
}

function verdict(message: string, sender: string): Promise<AuthVerdict> {
  return authenticator.authenticate({
    message: (async function* () {
      yield Buffer.from(message, 'latin1');
    })(),
    clientAddress: '127.0.0.3',
    helo: 'mail.sender.test',
    envelopeFrom: sender,
  });
}

const BODY = `${'line of body text that no signature covers\r\n'.repeat(300)}-- \r\nsig\r\n`;
const message = (from: string, extra = '') =>
  `${extra}From: S <${from}>\r\nTo: x@svc.test\r\nSubject: hi\r\nMessage-ID: <1@x.test>\r\n\r\n${BODY}`;

describe('readsBody', () => {
  const CASES: [string, string[], boolean][] = [
    ['no signature field', ['Received', 'From', 'To', 'Subject', 'Authentication-Results'], false],
    ['no fields at all', [], false],
    ['DKIM-Signature', ['From', 'DKIM-Signature'], true],
    ['DKIM-Signature in another case', ['dkim-SIGNATURE'], true],
    ['DKIM-Signature with blanks around the name (mailauth trims them)', [' DKIM-Signature\t'], true],
    ['ARC-Message-Signature', ['ARC-Message-Signature'], true],
    ['ARC-Seal or ARC-Authentication-Results alone (counted in, to be safe)', ['arc-seal'], true],
    ['a name that only starts like one', ['DKIM-Signatures', 'X-DKIM-Signature', 'ARC'], false],
  ];
  for (const [name, fields, expected] of CASES) {
    test(name, () => assert.equal(authenticator.readsBody(fields), expected));
  }
});

describe('an unsigned message gets the same verdict from its header block alone', () => {
  const CASES: [string, string, string][] = [
    ['SPF and DMARC pass', message('s@allowed.test'), 's@allowed.test'],
    ['SPF fail, DMARC fail under p=reject', message('s@strict.test'), 's@strict.test'],
    ['no DNS records for the domain', message('s@nowhere.test'), 's@nowhere.test'],
    ['a null envelope sender', message('s@allowed.test'), ''],
    [
      'an Authentication-Results field from the sender',
      message('s@allowed.test', 'Authentication-Results: mx.svc.test; dkim=pass header.d=allowed.test\r\n'),
      's@allowed.test',
    ],
    ['no From field', 'To: x@svc.test\r\nSubject: hi\r\n\r\nbody\r\n', 's@allowed.test'],
  ];
  for (const [name, raw, sender] of CASES) {
    test(name, async () => {
      const { head, names } = split(raw);
      assert.equal(authenticator.readsBody(names), false);
      assert.ok(raw.length > head.length, 'the message has a body');
      assert.deepEqual(await verdict(head, sender), await verdict(raw, sender));
    });
  }
});

test('a DKIM-signed message needs its body: without it the signature fails, so readsBody says yes', async () => {
  const raw = message('s@allowed.test');
  const signed = (await dkimSignFor('allowed.test', Buffer.from(raw, 'latin1'))).toString('latin1');
  const { head, names } = split(signed);
  assert.equal(authenticator.readsBody(names), true);
  const whole = await verdict(signed, 's@allowed.test');
  assert.equal(whole.alignedDkimPass, true);
  assert.match(whole.headerValue, /dkim=pass/);
  const headersOnly = await verdict(head, 's@allowed.test');
  assert.equal(headersOnly.alignedDkimPass, false);
  assert.doesNotMatch(headersOnly.headerValue, /dkim=pass/);
});
