/**
 * MilterCheck without a queue id (beginMessage throws: the milter adapter answers EOH with a tempfail),
 * and when authentication itself fails (mailauth throwing on a message): the consumer's calls reject,
 * which the milter adapter turns into a tempfail, and nothing is left unhandled to end the process. A
 * body larger than the stream's buffer shows that a waiting chunk fails too.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { MessageAdmission } from '../src/core/message-admission.ts';
import type { Authenticator } from '../src/core/ports.ts';
import { MilterCheck } from '../src/mail/milter-check.ts';

const envelope = {
  queueId: 'Q1',
  clientAddress: '127.0.0.3',
  clientName: 'mail.sender.test',
  helo: 'mail.sender.test',
  envelopeFrom: 's@allowed.test',
  mailArgs: [],
  recipients: ['x@svc.test'],
  macros: new Map<string, string>(),
};

test('an authenticator that fails makes body() and end() reject, and leaves no unhandled rejection', async () => {
  const unhandled: unknown[] = [];
  const onUnhandled = (reason: unknown) => unhandled.push(reason);
  process.on('unhandledRejection', onUnhandled);
  try {
    const failing: Authenticator = { authenticate: async () => Promise.reject(new Error('mailauth broke')) };
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
  const authenticator: Authenticator = { authenticate: async () => assert.fail('nothing to authenticate') };
  const admission = { admit: async () => assert.fail('nothing to decide') };
  const check = new MilterCheck(admission as unknown as MessageAdmission, authenticator, 'mx.svc.test');
  assert.throws(
    () => check.beginMessage({ ...envelope, queueId: '' }, [{ name: 'Subject', value: ' hi' }]),
    /no queue id from the MTA: milter_data_macros must include i/,
  );
});
