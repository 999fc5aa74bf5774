/**
 * Idempotent delivery through the real Postfix (contract "Receiving mail": delivery of one original
 * delivery attempt is idempotent; DESIGN decision 5): the receiver stores a message, but Postfix never
 * hears its 250 (here: its wait for the reply after end of data, lmtp_data_done_timeout, runs out while
 * the store waits for a lock), so Postfix keeps the queue file and delivers it again. The second
 * delivery is answered "already stored" and the inbox holds one copy.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import pg from 'pg';
import { scalar } from '../support/jobs.ts';
import { type MailStack, plainMessage, startMailStack } from '../support/mail-stack.ts';
import { queuedAs } from '../support/smtp-client.ts';

let s: MailStack;
before(async () => {
  s = await startMailStack({
    env: { POLL_RATE_BURST: '100000' },
    postfix: { lmtp_data_done_timeout: '2s' },
  });
});
after(() => s?.close());

test('a message stored while Postfix stopped waiting for its 250 is delivered again and kept once', async () => {
  const inbox = await s.provision();
  // Queued while the receiver is down: Postfix defers it and delivers it when told to.
  await s.stopDaemon('lmtp');
  const replies = await s.send({ to: [inbox.address], message: plainMessage({ to: inbox.address }) });
  const queueId = queuedAs(replies);
  assert.ok(queueId, JSON.stringify(replies));
  await s.startDaemon('lmtp');

  // Holding the inbox row makes the store wait (its usage counter is updated when the reservation
  // becomes the stored message) until after Postfix has given up on the reply.
  const holder = new pg.Client({ connectionString: s.database.url });
  await holder.connect();
  try {
    await holder.query('BEGIN');
    await holder.query('SELECT 1 FROM inboxes WHERE inbox_id = $1 FOR UPDATE', [inbox.inbox_id]);
    await s.postfix.flush();
    await s.waitFor('Postfix to give up on the reply', async () =>
      /timeout while receiving the reply to end of data|conversation with .* timed out/i.test(
        await s.postfix.maillog(),
      )
        ? true
        : undefined,
    );
    await holder.query('COMMIT');
  } finally {
    await holder.end();
  }
  const stored = () =>
    scalar(s, `SELECT count(*) FROM messages WHERE inbox_id = $1 AND state <> 'in_flight'`, [inbox.inbox_id]);
  await s.waitFor('the first delivery stored', async () => ((await stored()) === 1 ? true : undefined));

  await s.postfix.flush();
  await s.waitFor('the queue to drain', async () => ((await s.postfix.queueEmpty()) ? true : undefined));
  const log = await s.postfix.maillog();
  assert.match(log, new RegExp(`${queueId}: .*status=sent \\(250 2\\.0\\.0 msg_\\w+ already stored\\)`));
  assert.equal(await stored(), 1);
  const listed = await s.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, {
    token: inbox.credentials.owner,
  });
  assert.equal(listed.json.messages.length, 1);
});
