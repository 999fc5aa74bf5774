/**
 * MilterCheck without a queue id (beginMessage throws: the milter adapter answers EOH with a tempfail),
 * and when authentication itself fails (mailauth throwing on a message): the consumer's calls reject,
 * which the milter adapter turns into a tempfail, and nothing is left unhandled to end the process. A
 * body larger than the stream's buffer shows that a waiting chunk fails too. And what the authenticator
 * is given: the whole message when it reads bodies, else the header block alone, at once; either way
 * the size decided on counts the body.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { MessageAdmission } from '../src/core/message-admission.ts';
import type { AuthenticationRequest, Authenticator, AuthVerdict } from '../src/core/ports.ts';
import { untrackedDecision } from '../src/core/reservation-ledger.ts';
import { MilterCheck } from '../src/mail/milter-check.ts';
import { milterEnvelope } from './support/milter-message.ts';

const envelope = milterEnvelope();

test('an authenticator that fails makes body() and end() reject, and leaves no unhandled rejection', async () => {
  const unhandled: unknown[] = [];
  const onUnhandled = (reason: unknown) => unhandled.push(reason);
  process.on('unhandledRejection', onUnhandled);
  try {
    const failing: Authenticator = {
      authenticate: async () => Promise.reject(new Error('mailauth broke')),
      readsBody: () => true,
    };
    const admission = { admit: async () => assert.fail('no decision without authentication') };
    const check = new MilterCheck(admission as unknown as MessageAdmission, failing, 'mx.svc.test');
    const consumer = check.beginMessage(envelope, [{ name: 'Subject', value: ' hi' }]);
    // Nobody reads the stream: once its buffer is full, a chunk waits for room, then fails with auth.
    await assert.rejects(consumer.body(Buffer.alloc(1024 * 1024, 0x61)), /mailauth broke/);
    await assert.rejects(consumer.end(), /mailauth broke/);
    // A small body never waits for room: the failure is only seen at end(), some time later.
    const small = check.beginMessage(envelope, [{ name: 'Subject', value: ' hi' }]);
    await small.body(Buffer.from('short body\r\n'));
    await new Promise((resolve) => setTimeout(resolve, 20));
    await assert.rejects(small.end(), /mailauth broke/);
    assert.deepEqual(unhandled, []);
  } finally {
    process.off('unhandledRejection', onUnhandled);
  }
});

test('a message without a queue id (no `i` macro) fails at once, before anything is authenticated or reserved', () => {
  const authenticator: Authenticator = {
    authenticate: async () => assert.fail('nothing to authenticate'),
    readsBody: () => assert.fail('nothing to authenticate'),
  };
  const admission = { admit: async () => assert.fail('nothing to decide') };
  const check = new MilterCheck(admission as unknown as MessageAdmission, authenticator, 'mx.svc.test');
  assert.throws(
    () => check.beginMessage({ ...envelope, queueId: '' }, [{ name: 'Subject', value: ' hi' }]),
    /no queue id from the MTA: milter_data_macros must include i/,
  );
});

const VERDICT: AuthVerdict = {
  fromDomain: 'allowed.test',
  dmarc: { result: 'pass', policy: 'none' },
  alignedDkimPass: false,
  headerValue: 'mx.svc.test; dkim=none',
};

/** An authenticator that records what it is asked and reads the whole message it is given. */
function recording(readsBody: boolean) {
  const seen = { names: [] as string[], bytes: Buffer.alloc(0), readAll: false };
  const authenticator: Authenticator = {
    readsBody: (names) => {
      seen.names = [...names];
      return readsBody;
    },
    authenticate: async (request: AuthenticationRequest) => {
      const parts: Buffer[] = [];
      for await (const part of request.message) parts.push(part);
      seen.bytes = Buffer.concat(parts);
      seen.readAll = true;
      return VERDICT;
    },
  };
  const sizes: number[] = [];
  const admission = {
    open: () => untrackedDecision([], new Date()),
    admit: async (facts: { sizeBytes: number }) => {
      sizes.push(facts.sizeBytes);
      return { kind: 'accept' };
    },
  };
  const check = new MilterCheck(admission as unknown as MessageAdmission, authenticator, 'mx.svc.test');
  return { seen, sizes, check };
}

const HEADERS = [
  { name: 'From', value: ' S <s@allowed.test>' },
  { name: 'Subject', value: ' hi\n there' },
];
const HEAD = 'From: S <s@allowed.test>\r\nSubject: hi\r\n there\r\n\r\n';
const BODY = [Buffer.from('first line\r\n'), Buffer.alloc(100_000, 0x62), Buffer.from('\r\nlast\r\n')];
const BODY_BYTES = BODY.reduce((n, b) => n + b.length, 0);

test('an authenticator that reads bodies gets the whole message; the size counts it all', async () => {
  const { seen, sizes, check } = recording(true);
  const consumer = check.beginMessage(envelope, HEADERS);
  assert.deepEqual(seen.names, ['From', 'Subject']);
  for (const chunk of BODY) await consumer.body(chunk);
  await consumer.end();
  assert.equal(seen.bytes.toString('latin1'), HEAD + Buffer.concat(BODY).toString('latin1'));
  assert.deepEqual(sizes, [Buffer.byteLength(HEAD) + BODY_BYTES]);
});

test('an authenticator that does not read this body gets the header block alone, before the body comes', async () => {
  const { seen, sizes, check } = recording(false);
  const consumer = check.beginMessage(envelope, HEADERS);
  // The header block is complete at once: authentication finishes with no body given and no end().
  await new Promise((resolve) => setTimeout(resolve, 20));
  assert.equal(seen.readAll, true);
  assert.equal(seen.bytes.toString('latin1'), HEAD);
  for (const chunk of BODY) await consumer.body(chunk);
  const result = await consumer.end();
  assert.equal(seen.bytes.toString('latin1'), HEAD);
  assert.deepEqual(sizes, [Buffer.byteLength(HEAD) + BODY_BYTES]);
  assert.deepEqual(result.edits?.insert, [
    { index: 0, name: 'Authentication-Results', value: VERDICT.headerValue },
  ]);
});
