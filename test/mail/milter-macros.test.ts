/**
 * postfix/README.md, "What breaks the contract": `milter_data_macros` without `i` leaves the milter
 * without a queue id. Through real Postfix, such a message must get a temporary 451 4.7.1 at end of
 * data (the milter fails it at end of headers), with the reason logged, and nothing reserved,
 * recorded or queued: never a reservation under an empty queue id.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { type MailStack, plainMessage, startMailStack } from '../support/mail-stack.ts';

let s: MailStack;
before(async () => {
  s = await startMailStack({ postfix: { milter_data_macros: '' } });
});
after(async () => {
  await s?.close();
});

test('without the queue id macro, end of data gets 451 4.7.1, the reason is logged, and the inbox is untouched', async () => {
  const inbox = await s.provision();
  const r = await s.send({ to: [inbox.address], message: plainMessage({ to: inbox.address }) });
  assert.equal(r.rcpt[0]?.code, 250, r.rcpt[0]?.text);
  assert.equal(r.end?.text, '451 4.7.1 Service unavailable - try again later');
  assert.ok(
    s.logs.some((line) => String(line.error ?? '').includes('no queue id from the MTA')),
    'the milter logs why',
  );
  const status = await s.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.owner });
  assert.equal(status.status, 200, status.text);
  assert.deepEqual(
    [status.json.message_count, status.json.quota_used_bytes, status.json.rejection_count],
    [0, 0, 0],
  );
  assert.ok(await s.postfix.queueEmpty());
});
