/**
 * Authentication end to end (contract section 2 "Message summary" `authentication`, section 4
 * "Receiving mail"; DESIGN decisions 2 and 6): real SMTP into the real Postfix, our milter running
 * mailauth against the test zone's DNS (test/support/dns-zone.ts), the LMTP receiver reading the
 * verdict back from our own Authentication-Results field.
 *
 * Choice of domains, case by case:
 * - allowed.test signs (key `sel`), publishes SPF for 127/8 and DMARC p=reject: the well-behaved sender.
 * - An envelope sender in lax.test (SPF `?all`, so `neutral`) takes SPF alignment away, so DMARC
 *   can only pass through an aligned DKIM signature: that is how the DKIM-only paths are isolated.
 * - strict.test fails SPF and is unsigned under p=reject: the one refusal at end of data.
 * - lax.test unsigned fails DMARC under p=none: delivered with the failure reported.
 */
import assert from 'node:assert/strict';
import { generateKeyPairSync } from 'node:crypto';
import { after, before, test } from 'node:test';
import { dkimSign } from 'mailauth';
import type { ProvisionedInbox } from '../../src/core/inbox-service.ts';
import { DKIM_SELECTOR, dkimSignFor, testZone } from '../support/dns-zone.ts';
import { type MailStack, plainMessage, startMailStack } from '../support/mail-stack.ts';

let s: MailStack;
/**
 * flaky.example publishes p=reject, but its DKIM key lookup fails: a name outside the zone's local
 * domains goes to no upstream and is REFUSED, which mailauth reads as temperror.
 */
const flakyKey = generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey.export({
  type: 'pkcs8',
  format: 'pem',
}) as string;

/** The message signed by flaky.example, whose key lookup fails (or as another domain and selector). */
async function signFlaky(
  message: Buffer,
  signingDomain = 'flaky.example',
  selector = DKIM_SELECTOR,
): Promise<Buffer> {
  const signer = { signingDomain, selector, privateKey: flakyKey };
  const signed = await dkimSign(message, {
    ...signer,
    canonicalization: 'relaxed/relaxed',
    algorithm: 'rsa-sha256',
    signatureData: [signer],
  });
  assert.deepEqual(signed.errors, []);
  return Buffer.concat([Buffer.from(signed.signatures), message]);
}

before(async () => {
  const txt = testZone().records.txt as Record<string, string>;
  txt['_dmarc.flaky.example'] = 'v=DMARC1; p=reject';
  txt['flaky.example'] = 'v=spf1 ip4:192.0.2.1 -all';
  // RFC 9989's test mode: the contract has none, p=reject is enforced.
  txt['_dmarc.testing.example'] = 'v=DMARC1; p=reject; t=y';
  txt['testing.example'] = 'v=spf1 ip4:192.0.2.1 -all';
  s = await startMailStack();
});
after(() => s?.close());

// biome-ignore lint/suspicious/noExplicitAny: poll JSON as served (validated against OpenAPI by the harness)
type Summary = any;

/** Waits for the one message poll lists in this inbox and returns its summary. */
async function onlyMessage(inbox: ProvisionedInbox): Promise<Summary> {
  const token = inbox.credentials.owner;
  const poll = await s.waitFor('the message in poll', async () => {
    const r = await s.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, { token });
    return r.json.messages.length > 0 ? r.json : undefined;
  });
  assert.equal(poll.messages.length, 1);
  return poll.messages[0];
}

async function download(inbox: ProvisionedInbox, summary: Summary): Promise<Buffer> {
  const r = await s.api.get(summary.url, { token: inbox.credentials.owner });
  assert.equal(r.status, 200);
  return r.bytes;
}

/** The header fields of a downloaded message, each as stored (folds kept). */
function headerFields(raw: Buffer): string[] {
  const text = raw.toString('latin1');
  const head = text.slice(0, text.indexOf('\r\n\r\n') + 2);
  return head.split(/\r\n(?=[^ \t])/).filter((f) => f !== '');
}

/** Asserts download = our Authentication-Results, then Postfix's Received, then exactly `sent`. */
function assertStoredAsSent(raw: Buffer, sent: Buffer): string {
  const fields = headerFields(raw);
  assert.match(fields[0] ?? '', /^Authentication-Results: mx\.svc\.test;/, raw.toString('latin1', 0, 800));
  assert.match(fields[1] ?? '', /^Received: from mail\.sender\.test /);
  const ours = `${fields[0]}\r\n${fields[1]}\r\n`;
  assert.equal(raw.subarray(0, Buffer.byteLength(ours, 'latin1')).toString('latin1'), ours);
  assert.ok(raw.subarray(Buffer.byteLength(ours, 'latin1')).equals(sent), 'the message as sent follows');
  return fields[0] as string;
}

/**
 * Signs with an explicit h= list (mailauth's default list has no X- fields), so the signature covers
 * the whitespace quirks this file puts in the header.
 */
async function signCovering(
  domain: 'allowed.test',
  message: Buffer,
  canonicalization: 'simple/simple' | 'relaxed/relaxed',
  headerList: string[],
): Promise<Buffer> {
  const privateKey = testZone().privateKeys[domain];
  assert.ok(privateKey);
  const signer = { signingDomain: domain, selector: DKIM_SELECTOR, privateKey, headerList };
  const result = await dkimSign(message, {
    ...signer,
    canonicalization,
    algorithm: 'rsa-sha256',
    signatureData: [signer],
  });
  assert.deepEqual(result.errors, []);
  assert.notEqual(result.signatures, '');
  return Buffer.concat([Buffer.from(result.signatures), message]);
}

/** Header fields with spacing quirks that only simple canonicalization notices. */
const QUIRKY_HEADERS = [
  'X-Tight:value',
  'Reply-To:<reply@allowed.test>',
  'References: <a@allowed.test>\r\n\t<b@allowed.test>\r\n  <c@allowed.test>',
  'List-Id:  Spaced   list  <list.allowed.test>',
  'Content-Description: trailing blanks   ',
];

test('relaxed/relaxed DKIM-signed mail from allowed.test gets dkim, spf and dmarc pass for allowed.test', async () => {
  const inbox = await s.provision();
  const message = await dkimSignFor(
    'allowed.test',
    plainMessage({ to: inbox.address, from: 'Alice <alice@allowed.test>', extraHeaders: QUIRKY_HEADERS }),
    'relaxed/relaxed',
  );
  const replies = await s.send({ from: 'bounces@allowed.test', to: [inbox.address], message });
  assert.match(replies.end?.text ?? '', /^250 2\.0\.0 Ok: queued as \w+$/, JSON.stringify(replies));

  const m = await onlyMessage(inbox);
  assert.deepEqual(m.authentication, {
    dmarc: { result: 'pass', domain: 'allowed.test' },
    dkim: { result: 'pass', domain: 'allowed.test' },
    spf: { result: 'pass', domain: 'allowed.test' },
  });
  const ours = assertStoredAsSent(await download(inbox, m), message);
  assert.match(ours, /dkim=pass header\.i=@allowed\.test header\.s=sel/);
  assert.match(ours, /spf=pass .*smtp\.mailfrom=bounces@allowed\.test/s);
  assert.match(ours, /dmarc=pass .*header\.from=allowed\.test/s);
});

test('simple/simple DKIM survives headers without a space after the colon, folded and padded headers', async () => {
  const inbox = await s.provision();
  const headerList = ['From', 'To', 'Subject', 'Message-ID', 'Date', 'X-Tight', 'Reply-To', 'References'];
  headerList.push('List-Id', 'Content-Description', 'Content-Type', 'MIME-Version');
  const unsigned = plainMessage({
    to: inbox.address,
    from: 'Alice <alice@allowed.test>',
    subject: 'simple\r\n   canonicalization',
    extraHeaders: QUIRKY_HEADERS,
    body: 'Line one.  \r\n\r\nLine three, after a blank line.\r\n\r\n',
  });
  const message = await signCovering('allowed.test', unsigned, 'simple/simple', headerList);
  const signature = message.toString('latin1', 0, message.length - unsigned.length);
  assert.match(signature, /c=simple\/simple/);
  const signed = /;h=([^;]*);/.exec(signature.replace(/\s/g, ''))?.[1]?.toLowerCase().split(':') ?? [];
  for (const name of ['x-tight', 'reply-to', 'references', 'list-id', 'content-description', 'subject']) {
    assert.ok(signed.includes(name), `h= covers ${name}: ${signature}`);
  }

  const replies = await s.send({ from: 'bounces@allowed.test', to: [inbox.address], message });
  assert.match(replies.end?.text ?? '', /^250 2\.0\.0 Ok: queued as \w+$/, JSON.stringify(replies));

  const m = await onlyMessage(inbox);
  // A milter that rebuilt the header with a different space after a colon, or different folds,
  // would turn this into dkim=fail (or neutral) while relaxed canonicalization still passed.
  assert.deepEqual(m.authentication, {
    dmarc: { result: 'pass', domain: 'allowed.test' },
    dkim: { result: 'pass', domain: 'allowed.test' },
    spf: { result: 'pass', domain: 'allowed.test' },
  });
  // RFC 5322 3.2.2: unfolding removes only the CRLF; the whitespace after it stays.
  assert.equal(m.subject, 'simple   canonicalization');
  assertStoredAsSent(await download(inbox, m), message);
});

test('an aligned DKIM pass alone makes DMARC pass when the envelope sender is in another domain', async () => {
  const inbox = await s.provision();
  const message = await dkimSignFor(
    'allowed.test',
    plainMessage({ to: inbox.address, from: 'alice@allowed.test' }),
    'simple/simple',
  );
  // SPF for lax.test is `?all`: neutral, and not aligned with From: allowed.test either way.
  const replies = await s.send({ from: 'bounce@lax.test', to: [inbox.address], message });
  assert.match(replies.end?.text ?? '', /^250 2\.0\.0 Ok: queued as \w+$/, JSON.stringify(replies));

  const m = await onlyMessage(inbox);
  assert.equal(m.envelope_from, 'bounce@lax.test');
  assert.deepEqual(m.authentication, {
    dmarc: { result: 'pass', domain: 'allowed.test' },
    dkim: { result: 'pass', domain: 'allowed.test' },
    spf: { result: 'neutral', domain: 'lax.test' },
  });
});

test('Authentication-Results fields claiming our authserv-id are removed and ignored; another authserv-id is kept below ours', async () => {
  const inbox = await s.provision();
  const kept = 'Authentication-Results: other.example; spf=pass smtp.mailfrom=x@other.example';
  const forged = [
    'Authentication-Results: mx.svc.test; dmarc=pass header.from=forged.test',
    'authentication-results: (x) MX.SVC.TEST; dkim=pass header.d=forged.test',
    'Authentication-Results:\r\n mx.svc.test 1;\r\n spf=pass smtp.mailfrom=a@forged.test',
    'Authentication-Results:mx.svc.test(no space);dmarc=pass header.from=forged.test',
    // Unicode white space or a byte-order mark next to the id (sent as UTF-8): a lenient reader's.
    'Authentication-Results: \u00a0mx.svc.test; dkim=pass header.i=@forged.test',
    'Authentication-Results: \ufeffmx.svc.test; dmarc=pass header.from=forged.test',
    'Authentication-Results: "mx.svc.test\u3000"; spf=pass smtp.mailfrom=a@forged.test',
  ];
  // Forged fields above, between and below the kept one: every index the milter deletes must hit.
  const header = (extra: string[]) =>
    plainMessage({
      to: inbox.address,
      from: 'Mallory <mallory@lax.test>',
      messageId: '<forged-ar@lax.test>',
      extraHeaders: extra,
    });
  const message = header([forged[0] as string, kept, ...forged.slice(1)]);
  const expectedStored = header([kept]);

  // lax.test is unsigned with SPF `?all` and p=none: the real verdict is a DMARC failure, delivered.
  const replies = await s.send({ from: 'bounce@lax.test', to: [inbox.address], message });
  assert.match(replies.end?.text ?? '', /^250 2\.0\.0 Ok: queued as \w+$/, JSON.stringify(replies));

  const m = await onlyMessage(inbox);
  assert.deepEqual(m.authentication, {
    dmarc: { result: 'fail', domain: 'lax.test' },
    dkim: { result: 'none', domain: null },
    spf: { result: 'neutral', domain: 'lax.test' },
  });
  const raw = await download(inbox, m);
  const text = raw.toString('latin1');
  assert.doesNotMatch(text, /forged\.test/i, 'no forged field is stored');
  const fields = headerFields(raw);
  const authResults = fields.filter((f) => /^authentication-results:/i.test(f));
  assert.equal(authResults.length, 2, authResults.join('\n'));
  assert.match(authResults[0] ?? '', /^Authentication-Results: mx\.svc\.test;/);
  assert.equal(authResults[1], kept);
  assert.ok(fields.indexOf(kept) > 1, 'the kept field stays below ours and Postfix Received');
  // Apart from the removed fields, the message is stored exactly as sent.
  assertStoredAsSent(raw, expectedStored);
  assert.equal(m.size_bytes, raw.length);
});

test('unsigned mail failing DMARC under p=none is delivered with dkim none, spf neutral and dmarc fail', async () => {
  const inbox = await s.provision();
  const message = plainMessage({ to: inbox.address, from: 'news@lax.test' });
  const replies = await s.send({ from: 'news@lax.test', to: [inbox.address], message });
  assert.match(replies.end?.text ?? '', /^250 2\.0\.0 Ok: queued as \w+$/, JSON.stringify(replies));

  const m = await onlyMessage(inbox);
  assert.deepEqual(m.authentication, {
    dmarc: { result: 'fail', domain: 'lax.test' },
    dkim: { result: 'none', domain: null },
    spf: { result: 'neutral', domain: 'lax.test' },
  });
  const ours = assertStoredAsSent(await download(inbox, m), message);
  assert.match(ours, /dkim=none/);
  assert.match(ours, /dmarc=fail \(p=NONE/);
});

test('a valid signature of an unaligned domain vouches only for the signer: dkim pass other.test, dmarc fail lax.test', async () => {
  const inbox = await s.provision();
  // d=other.test signs a From: lax.test message; lax.test publishes p=none, so it is still delivered.
  const message = await dkimSignFor('other.test', plainMessage({ to: inbox.address, from: 'x@lax.test' }));
  const replies = await s.send({ from: 'bounce@lax.test', to: [inbox.address], message });
  assert.match(replies.end?.text ?? '', /^250 2\.0\.0 Ok: queued as \w+$/, JSON.stringify(replies));

  const m = await onlyMessage(inbox);
  assert.deepEqual(m.authentication, {
    dmarc: { result: 'fail', domain: 'lax.test' },
    dkim: { result: 'pass', domain: 'other.test' },
    spf: { result: 'neutral', domain: 'lax.test' },
  });
});

test('DMARC failure under p=reject (strict.test) answers 550 5.7.1 DMARC checks failed and stores nothing', async () => {
  const inbox = await s.provision();
  const message = plainMessage({ to: inbox.address, from: 'ceo@strict.test' });
  const replies = await s.send({ from: 'ceo@strict.test', to: [inbox.address], message });
  assert.equal(replies.rcpt[0]?.code, 250);
  assert.equal(replies.data?.code, 354);
  assert.equal(replies.end?.text, '550 5.7.1 DMARC checks failed');

  // Not recorded either (contract 4: refused before it reaches an inbox).
  const r = await s.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, { token: inbox.credentials.owner });
  assert.deepEqual(r.json.messages, []);
  assert.deepEqual(r.json.rejections, []);
  assert.equal(r.json.inbox.message_count, 0);
  assert.equal(r.json.inbox.quota_used_bytes, 0);
  assert.equal(r.json.inbox.rejection_count, 0);
  assert.deepEqual(await s.postfix.queue(), []);
  assert.match(
    await s.postfix.maillog(),
    /milter-reject: END-OF-MESSAGE .*: 5\.7\.1 DMARC checks failed; from=<ceo@strict\.test>/,
  );
});

test('DMARC failure under p=reject with t=y (test mode) is refused all the same: 550, nothing stored', async () => {
  const inbox = await s.provision();
  const message = plainMessage({ to: inbox.address, from: 'ceo@testing.example' });
  const replies = await s.send({ from: 'ceo@testing.example', to: [inbox.address], message });
  // Until 2026-11-25 mailauth's lowering to quarantine let it through.
  assert.equal(replies.end?.text, '550 5.7.1 DMARC checks failed');
  const r = await s.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, { token: inbox.credentials.owner });
  assert.deepEqual(r.json.messages, []);
});

test('a body altered after signing gets dkim neutral; with SPF aligned DMARC still passes and it arrives', async () => {
  const inbox = await s.provision();
  const signed = await dkimSignFor(
    'allowed.test',
    plainMessage({ to: inbox.address, from: 'alice@allowed.test', body: 'Your code is 123456.' }),
  );
  const message = Buffer.from(signed.toString('latin1').replace('123456', '654321'), 'latin1');
  // Envelope in allowed.test: SPF passes and is aligned, so p=reject does not apply.
  const replies = await s.send({ from: 'bounces@allowed.test', to: [inbox.address], message });
  assert.match(replies.end?.text ?? '', /^250 2\.0\.0 Ok: queued as \w+$/, JSON.stringify(replies));

  const m = await onlyMessage(inbox);
  assert.deepEqual(m.authentication, {
    dmarc: { result: 'pass', domain: 'allowed.test' },
    dkim: { result: 'neutral', domain: 'allowed.test' },
    spf: { result: 'pass', domain: 'allowed.test' },
  });
  const ours = assertStoredAsSent(await download(inbox, m), message);
  assert.match(ours, /dkim=neutral \(body hash did not verify\)/);
});

test('a body altered after signing, without SPF alignment, fails DMARC under p=reject: 550, nothing stored', async () => {
  const inbox = await s.provision();
  const signed = await dkimSignFor(
    'allowed.test',
    plainMessage({ to: inbox.address, from: 'alice@allowed.test', body: 'Pay to account 1.' }),
  );
  const message = Buffer.from(signed.toString('latin1').replace('account 1', 'account 2'), 'latin1');
  // The broken signature is all there is: SPF for lax.test is neutral and unaligned anyway.
  const replies = await s.send({ from: 'bounce@lax.test', to: [inbox.address], message });
  assert.equal(replies.end?.text, '550 5.7.1 DMARC checks failed');
  const r = await s.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, { token: inbox.credentials.owner });
  assert.deepEqual(r.json.messages, []);
  assert.equal(r.json.inbox.message_count, 0);
});

test('a signature over raw UTF-8 header bytes passes (the milter rebuilds header octets exactly)', async () => {
  const inbox = await s.provision();
  const message = await dkimSignFor(
    'allowed.test',
    plainMessage({ to: inbox.address, from: 'José <jose@allowed.test>', subject: 'Café über alles' }),
    'simple/simple',
  );
  const replies = await s.send({ from: 'bounce@lax.test', to: [inbox.address], message });
  assert.match(replies.end?.text ?? '', /^250 2\.0\.0 Ok: queued as \w+$/, JSON.stringify(replies));
  const m = await onlyMessage(inbox);
  assert.deepEqual(m.authentication?.dkim, { result: 'pass', domain: 'allowed.test' });
  assert.deepEqual(m.authentication?.dmarc, { result: 'pass', domain: 'allowed.test' });
  assertStoredAsSent(await download(inbox, m), message);
});

test('a signature over raw 8-bit header bytes that are not UTF-8 (Latin-1) passes, and DMARC with it', async () => {
  const inbox = await s.provision();
  // RFC 6376 signs octets: a legacy sender's raw ISO-8859-1 Subject is as valid a signed header as any.
  // The envelope is in lax.test, so this aligned signature is the only way DMARC can pass.
  const latin1 = Buffer.from(
    plainMessage({
      to: inbox.address,
      from: 'jose@allowed.test',
      subject: 'Caf\u00e9 cr\u00e8me',
    }).toString(),
    'latin1',
  );
  assert.ok(latin1.includes(Buffer.from([0x43, 0x61, 0x66, 0xe9])), 'Subject carries the raw byte 0xE9');
  const message = await dkimSignFor('allowed.test', latin1, 'relaxed/relaxed');
  const replies = await s.send({ from: 'bounce@lax.test', to: [inbox.address], message });
  assert.match(replies.end?.text ?? '', /^250 2\.0\.0 Ok: queued as \w+$/, JSON.stringify(replies));
  const m = await onlyMessage(inbox);
  assert.deepEqual(m.authentication, {
    dmarc: { result: 'pass', domain: 'allowed.test' },
    dkim: { result: 'pass', domain: 'allowed.test' },
    spf: { result: 'neutral', domain: 'lax.test' },
  });
  assertStoredAsSent(await download(inbox, m), message);
});

test('an Authentication-Results field giving our authserv-id as a quoted string is removed too', async () => {
  const inbox = await s.provision();
  // RFC 8601 2.2: authserv-id = value, and an RFC 2045 value is a token or a quoted-string, so
  // "mx.svc.test" names us as much as mx.svc.test does (our own reader, core/authentication-results.ts,
  // accepts it as ours). Section 5 says such a field from outside must be removed.
  const message = plainMessage({
    to: inbox.address,
    from: 'mallory@lax.test',
    extraHeaders: ['Authentication-Results: "mx.svc.test"; dmarc=pass header.from=forged.test'],
  });
  const replies = await s.send({ from: 'bounce@lax.test', to: [inbox.address], message });
  assert.match(replies.end?.text ?? '', /^250 2\.0\.0 Ok: queued as \w+$/, JSON.stringify(replies));
  const m = await onlyMessage(inbox);
  assert.equal(m.authentication?.dmarc.result, 'fail');
  const raw = await download(inbox, m);
  assert.doesNotMatch(raw.toString('latin1'), /forged\.test/, raw.toString('latin1', 0, 600));
});

test('an SPF pass for a long envelope sender is reported under its domain, never under the HELO name the client chose', async () => {
  const inbox = await s.provision();
  // mailauth leaves smtp.mailfrom out of our field when it is over 900 bytes; smtp.helo stays.
  const from = `${'a'.repeat(950)}@allowed.test`;
  const replies = await s.send({
    from,
    helo: 'bank.test',
    to: [inbox.address],
    message: plainMessage({ to: inbox.address, from: 'x@lax.test' }),
  });
  assert.match(replies.end?.text ?? '', /^250 /);
  const summary = await onlyMessage(inbox);
  assert.deepEqual(summary.authentication.spf, { result: 'pass', domain: 'allowed.test' });
});

test('a From: domain written with a trailing dot is the domain without it: admitted by sender_domains, refused when opted out', async () => {
  const listed = await s.provision(['allowed.test']);
  const signed = await dkimSignFor(
    'allowed.test',
    plainMessage({ to: listed.address, from: 'alice@allowed.test.' }),
  );
  const admitted = await s.send({ from: 'bounces@allowed.test', to: [listed.address], message: signed });
  assert.match(admitted.end?.text ?? '', /^250 /);
  assert.equal((await onlyMessage(listed)).authentication.dmarc.domain, 'allowed.test');

  await s.optOuts.add('other.test', s.clock.now());
  try {
    const inbox = await s.provision();
    const message = await dkimSignFor(
      'other.test',
      plainMessage({ to: inbox.address, from: 'news@other.test.' }),
    );
    const refused = await s.send({ from: 'bounces@allowed.test', to: [inbox.address], message });
    assert.equal(refused.end?.text, '555 5.7.1 svc.test: sender domain opted out');
  } finally {
    await s.optOuts.remove('other.test');
  }
});

test('a DMARC failure under p=reject that a failed DNS lookup may have caused (the key of an aligned signature) is a 451, retried, not a 550', async () => {
  const inbox = await s.provision();
  const message = plainMessage({ to: inbox.address, from: 'ceo@flaky.example' });
  const replies = await s.send({
    from: 'x@lax.test',
    to: [inbox.address],
    message: await signFlaky(message),
  });
  assert.equal(replies.end?.text, '451 4.7.1 DMARC checks could not be completed, try again later');
  // Unsigned, the same failure has no failed lookup behind it: refused for good.
  const unsigned = await s.send({ from: 'x@lax.test', to: [inbox.address], message });
  assert.equal(unsigned.end?.text, '550 5.7.1 DMARC checks failed');
});

test('a forged signature whose selector makes a malformed DNS name has no key: the p=reject failure is a 550, not a retried 451', async () => {
  const inbox = await s.provision();
  const message = plainMessage({ to: inbox.address, from: 'ceo@strict.test' });
  // Aligned with the forged From: (d=strict.test), with a right body hash; `bad!sel` is no DNS label.
  const replies = await s.send({
    from: 'x@lax.test',
    to: [inbox.address],
    message: await signFlaky(message, 'strict.test', 'bad!sel'),
  });
  assert.equal(replies.end?.text, '550 5.7.1 DMARC checks failed');
});

test('with several From: domains, a p=reject failure that a failed lookup for that domain may have caused is a 451 too; another domain failing is a 550', async () => {
  const inbox = await s.provision();
  const flaky = await signFlaky(plainMessage({ to: inbox.address, from: 'ceo@flaky.example, x@lax.test' }));
  const replies = await s.send({ from: 'x@lax.test', to: [inbox.address], message: flaky });
  assert.equal(replies.end?.text, '451 4.7.1 DMARC checks could not be completed, try again later');
  // strict.test fails with no failed lookup of its own: the flaky signature does not excuse it.
  const strict = await signFlaky(
    plainMessage({ to: inbox.address, from: 'ceo@strict.test, x@flaky.example' }),
  );
  const refused = await s.send({ from: 'x@lax.test', to: [inbox.address], message: strict });
  assert.equal(refused.end?.text, '550 5.7.1 DMARC checks failed');
});
