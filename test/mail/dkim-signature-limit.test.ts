/**
 * The signatures the milter lets mailauth verify (src/mail/signature-limits.ts): the last (bottom)
 * MAX_DKIM_SIGNATURES DKIM-Signature fields, and none whose h= lists more than MAX_SIGNED_NAMES names.
 * A crafted message with thousands of signatures over large header fields froze the milter for tens of
 * seconds and then ran it out of heap (mailauth keeps every signature's covered fields, canonicalized,
 * and loops over them without yielding): each attempt crashed the milter, and every session in progress
 * got Postfix's tempfail. With the limits such a message is checked at once, the author's signature at
 * the bottom still counts, and the size decided on is the message as sent.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { MessageAdmission, MessageFacts } from '../../src/core/message-admission.ts';
import type { AuthenticationRequest, Authenticator } from '../../src/core/ports.ts';
import { untrackedDecision } from '../../src/core/reservation-ledger.ts';
import type { CachingLookup } from '../../src/mail/dns.ts';
import { loadMailauth, MailauthAuthenticator } from '../../src/mail/mailauth-authenticator.ts';
import { MilterCheck } from '../../src/mail/milter-check.ts';
import {
  MAX_DKIM_SIGNATURES,
  MAX_SIGNED_NAMES,
  signedNames,
  verifiableHeaders,
} from '../../src/mail/signature-limits.ts';
import { dkimSignFor, resolveInZone } from '../support/dns-zone.ts';
import { milterEnvelope, milterMessage } from '../support/milter-message.ts';

const envelope = milterEnvelope();
const headersOf = milterMessage;

function admissionRecording(): { facts: MessageFacts[]; admission: MessageAdmission } {
  const facts: MessageFacts[] = [];
  const admission = {
    open: () => untrackedDecision([], new Date()),
    admit: async (f: MessageFacts) => {
      facts.push(f);
      return { kind: 'accept' };
    },
  } as unknown as MessageAdmission;
  return { facts, admission };
}

const bogusSignature = (i: number) =>
  `DKIM-Signature: a=rsa-sha256; c=relaxed; d=bogus.test; s=s${i}; h=x-big:x-big:x-big:x-big:x-big; bh=x; b=y`;

test('the authenticator is given the last MAX_DKIM_SIGNATURES signatures and every other field; the size counts all', async () => {
  let given = '';
  const authenticator: Authenticator = {
    readsBody: () => false,
    authenticate: async (request: AuthenticationRequest) => {
      for await (const part of request.message) given += part.toString('latin1');
      return {
        fromDomain: null,
        dmarc: { result: 'none', policy: null },
        alignedDkimPass: false,
        headerValue: 'x',
      };
    },
  };
  const { facts, admission } = admissionRecording();
  const raw = Buffer.from(
    `${Array.from({ length: 25 }, (_, i) => `${bogusSignature(i)}\r\n`).join('')}From: s@allowed.test\r\nSubject: hi\r\n\r\nbody\r\n`,
  );
  const { headers, body } = headersOf(raw);
  const consumer = new MilterCheck(admission, authenticator, 'mx.svc.test').beginMessage(envelope, headers);
  await consumer.body(body);
  await consumer.end();
  const kept = given.split('\r\n').filter((line) => line.startsWith('DKIM-Signature:'));
  assert.deepEqual(
    kept,
    Array.from({ length: MAX_DKIM_SIGNATURES }, (_, i) => bogusSignature(25 - MAX_DKIM_SIGNATURES + i)),
  );
  assert.match(given, /\r\nFrom: s@allowed\.test\r\nSubject: hi\r\n\r\n$/);
  assert.equal(facts[0]?.sizeBytes, raw.length);
});

test('signedNames counts the names of the h= tag; verifiableHeaders leaves out wide signatures and keeps the bottom ones in order', () => {
  assert.equal(signedNames(' v=1; a=rsa-sha256; h=From:To : Subject;\n bh=x; b=y'), 3);
  assert.equal(signedNames('v=1; a=rsa-sha256; bh=x; b=y'), 0);
  // A repeated tag: mailauth reads the last; the widest counts, whichever it is.
  const manyNames = Array(MAX_SIGNED_NAMES + 1)
    .fill('a')
    .join(':');
  assert.equal(signedNames(`v=1; h=from; bh=x; b=y; h=${manyNames}`), MAX_SIGNED_NAMES + 1);
  assert.equal(signedNames(`v=1; h=${manyNames}; bh=x; b=y; h=from`), MAX_SIGNED_NAMES + 1);
  assert.equal(
    signedNames(
      `i=1; h=${Array(MAX_SIGNED_NAMES + 1)
        .fill('a')
        .join(':')}; b=y`,
    ),
    MAX_SIGNED_NAMES + 1,
  );
  const wide = {
    name: 'ARC-Message-Signature',
    value: ` i=1; h=${Array(MAX_SIGNED_NAMES + 1)
      .fill('a')
      .join(':')}; b=y`,
  };
  const plain = [{ name: 'From', value: ' a@b.test' }];
  assert.equal(verifiableHeaders(plain), plain, 'nothing left out: the same list');
  const signatures = Array.from({ length: MAX_DKIM_SIGNATURES + 2 }, (_, i) => ({
    name: i % 2 ? 'DKIM-Signature' : 'dkim-signature',
    value: ` d=s${i}.test; h=from:dkim-signature; b=y`,
  }));
  const kept = verifiableHeaders([wide, ...signatures, ...plain]);
  assert.deepEqual(kept, [...signatures.slice(2), ...plain]);
});

test('thousands of signatures over large fields: checked at once, the real signature at the bottom still passes', async () => {
  await loadMailauth();
  const big = Array.from({ length: 5 }, (_, i) => `X-Big: ${i} ${'x y  '.repeat(20_000)}\r\n`).join('');
  const signed = await dkimSignFor(
    'allowed.test',
    Buffer.from(`From: S <s@allowed.test>\r\nTo: x@svc.test\r\nSubject: many signatures\r\n\r\nbody\r\n`),
  );
  // 3,000 signatures that each cover the five 100 KB fields, added above the author's real one (as
  // forwarders add theirs).
  const raw = Buffer.concat([
    Buffer.from(Array.from({ length: 3000 }, (_, i) => `${bogusSignature(i)}\r\n`).join('') + big),
    signed,
  ]);
  const result = await checked(raw);
  assert.ok(
    result.ms < 5_000,
    `took ${Math.round(result.ms)} ms (unbounded, it took 23 s and then exhausted the heap)`,
  );
  assert.ok(result.heapGrowth < 512 * 1024 * 1024, 'heap grew by less than 512 MiB');
  assert.equal(result.verdict, 'accept');
  assert.equal(result.facts?.auth.alignedDkimPass, true, 'the real signature is verified');
  assert.match(result.authenticationResults, /dkim=pass[^;]*header\.i=@allowed\.test/);
  assert.equal(result.facts?.sizeBytes, raw.length);
});

test('one signature listing tens of thousands of names over a hundred thousand short fields is left out: checked at once', async () => {
  await loadMailauth();
  const signed = await dkimSignFor(
    'allowed.test',
    Buffer.from(`From: S <s@allowed.test>\r\nTo: x@svc.test\r\nSubject: wide\r\n\r\nbody\r\n`),
  );
  const wide = `DKIM-Signature: a=rsa-sha256; d=bogus.test; s=s; h=${Array(40_000).fill('absent').join(':')}; bh=x; b=y\r\n`;
  const short = 'a: b\r\n'.repeat(100_000);
  const raw = Buffer.concat([Buffer.from(wide + short), signed]);
  const result = await checked(raw);
  assert.ok(result.ms < 5_000, `took ${Math.round(result.ms)} ms`);
  assert.equal(result.facts?.auth.alignedDkimPass, true, 'the real signature is still verified');
});

/** The message through MilterCheck with the real mailauth (DNS from the test zone). */
async function checked(raw: Buffer) {
  const { headers, body } = headersOf(raw);
  const { facts, admission } = admissionRecording();
  const lookup = { resolve: resolveInZone } as unknown as CachingLookup;
  const check = new MilterCheck(admission, new MailauthAuthenticator('mx.svc.test', lookup), 'mx.svc.test');
  const heapBefore = process.memoryUsage().heapUsed;
  const started = performance.now();
  const consumer = check.beginMessage(envelope, headers);
  await consumer.body(body);
  const result = await consumer.end();
  return {
    ms: performance.now() - started,
    heapGrowth: process.memoryUsage().heapUsed - heapBefore,
    verdict: result.verdict.kind,
    authenticationResults: result.edits?.insert[0]?.value ?? '',
    facts: facts[0],
  };
}
