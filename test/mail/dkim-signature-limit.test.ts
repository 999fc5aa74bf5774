/**
 * The milter verifies at most MAX_DKIM_SIGNATURES DKIM-Signature fields per message (src/mail/
 * milter-check.ts). A crafted message with thousands of signatures over large header fields froze the
 * milter for tens of seconds and then ran it out of heap (mailauth keeps every signature's covered
 * fields, canonicalized, and loops over them without yielding): each attempt crashed the milter, and
 * every session in progress got Postfix's tempfail. With the limit, such a message is checked at once,
 * its first (real) signature still counts, and the size decided on is the message as sent.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { MessageAdmission, MessageFacts } from '../../src/core/message-admission.ts';
import type { AuthenticationRequest, Authenticator } from '../../src/core/ports.ts';
import type { CachingLookup } from '../../src/mail/dns.ts';
import { loadMailauth, MailauthAuthenticator } from '../../src/mail/mailauth-authenticator.ts';
import { MAX_DKIM_SIGNATURES, MilterCheck } from '../../src/mail/milter-check.ts';
import type { MilterEnvelope, MilterHeader } from '../../src/milter/handler.ts';
import { dkimSignFor, resolveInZone } from '../support/dns-zone.ts';

const envelope: MilterEnvelope = {
  queueId: 'Q1',
  clientAddress: '127.0.0.3',
  clientName: 'mail.sender.test',
  helo: 'mail.sender.test',
  envelopeFrom: 's@allowed.test',
  mailArgs: [],
  recipients: ['x@svc.test'],
  macros: new Map(),
};

/** Header fields as the milter gets them from Postfix (value after the colon, LF line ends). */
function headersOf(raw: Buffer): { headers: MilterHeader[]; body: Buffer } {
  const text = raw.toString('latin1');
  const end = text.indexOf('\r\n\r\n');
  const headers = text
    .slice(0, end)
    .split(/\r\n(?![ \t])/)
    .map((field) => {
      const colon = field.indexOf(':');
      return { name: field.slice(0, colon), value: field.slice(colon + 1).replace(/\r\n/g, '\n') };
    });
  return { headers, body: raw.subarray(end + 4) };
}

function admissionRecording(): { facts: MessageFacts[]; admission: MessageAdmission } {
  const facts: MessageFacts[] = [];
  const admission = {
    admit: async (f: MessageFacts) => {
      facts.push(f);
      return { kind: 'accept' };
    },
  } as unknown as MessageAdmission;
  return { facts, admission };
}

const bogusSignature = (i: number) =>
  `DKIM-Signature: a=rsa-sha256; c=relaxed; d=bogus.test; s=s${i}; h=x-big:x-big:x-big:x-big:x-big; bh=x; b=y`;

test('the authenticator is given the first MAX_DKIM_SIGNATURES signatures and every other field; the size counts all', async () => {
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
    Array.from({ length: MAX_DKIM_SIGNATURES }, (_, i) => bogusSignature(i)),
  );
  assert.match(given, /\r\nFrom: s@allowed\.test\r\nSubject: hi\r\n\r\n$/);
  assert.equal(facts[0]?.sizeBytes, raw.length);
});

test('thousands of signatures over large fields: checked at once, the real signature on top still passes', async () => {
  await loadMailauth();
  const big = Array.from({ length: 5 }, (_, i) => `X-Big: ${i} ${'x y  '.repeat(20_000)}\r\n`).join('');
  const signed = await dkimSignFor(
    'allowed.test',
    Buffer.from(`From: S <s@allowed.test>\r\nTo: x@svc.test\r\nSubject: many signatures\r\n\r\nbody\r\n`),
  );
  // The real signature first, then 3,000 that each cover the five 100 KB fields.
  const split = signed.indexOf('From: S');
  const raw = Buffer.concat([
    signed.subarray(0, split),
    Buffer.from(Array.from({ length: 3000 }, (_, i) => `${bogusSignature(i)}\r\n`).join('') + big),
    signed.subarray(split),
  ]);
  const { headers, body } = headersOf(raw);
  const { facts, admission } = admissionRecording();
  const lookup = { resolve: resolveInZone } as unknown as CachingLookup;
  const check = new MilterCheck(admission, new MailauthAuthenticator('mx.svc.test', lookup), 'mx.svc.test');
  const heapBefore = process.memoryUsage().heapUsed;
  const started = performance.now();
  const consumer = check.beginMessage(envelope, headers);
  await consumer.body(body);
  const result = await consumer.end();
  const ms = performance.now() - started;
  assert.ok(ms < 5_000, `took ${Math.round(ms)} ms (unbounded, it took 23 s and then exhausted the heap)`);
  assert.ok(
    process.memoryUsage().heapUsed - heapBefore < 512 * 1024 * 1024,
    'heap grew by less than 512 MiB',
  );
  assert.equal(result.verdict.kind, 'accept');
  assert.equal(facts[0]?.auth.alignedDkimPass, true, 'the real signature is verified');
  assert.match(result.edits?.insert[0]?.value ?? '', /dkim=pass[^;]*header\.i=@allowed\.test/);
  assert.equal(facts[0]?.sizeBytes, raw.length);
});
