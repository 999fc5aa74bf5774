/**
 * Postfix's own notices never reach an inbox (postfix/README.md, `notice-cleanup`). A delivery status
 * notification or a bounce goes to the envelope sender, and an inbox address may be that sender: such a
 * notice enters through Postfix's bounce daemon, not smtpd, so no policy check, no milter, no
 * sender_domains, no quota and no Authentication-Results, and it would carry the sender's message,
 * whatever it says, into the inbox. Notices are discarded, and nobody on the host may submit mail
 * (accepted mail an admin requeues through pickup is still delivered: failures.test.ts).
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { after, before, test } from 'node:test';
import { promisify } from 'node:util';
import pg from 'pg';
import type { ProvisionedInbox } from '../../src/core/inbox-service.ts';
import { type MailStack, plainMessage, startMailStack } from '../support/mail-stack.ts';
import { queuedAs } from '../support/smtp-client.ts';

const DISCARDED = /status=sent \(not received by SMTP\)/;

let s: MailStack;
before(async () => {
  // A deferred message is returned to its sender at once: the bounce of the second test.
  s = await startMailStack({ postfix: { maximal_queue_lifetime: '0' } });
});
after(() => s?.close());

async function messageRows(inbox: ProvisionedInbox): Promise<number> {
  const client = new pg.Client({ connectionString: s.database.url });
  await client.connect();
  try {
    const { rows } = await client.query<{ n: number }>(
      'SELECT count(*)::int AS n FROM messages WHERE inbox_id = $1',
      [inbox.inbox_id],
    );
    return rows[0]?.n ?? 0;
  } finally {
    await client.end();
  }
}

/** The queue id of the notice Postfix made about `queueId` (`what`: its maillog wording). */
const noticeOf = (queueId: string, what: string) =>
  s.waitFor(`the ${what} of ${queueId}`, async () => {
    const match = new RegExp(`${queueId}: sender ${what}: (\\w+)`).exec(await s.postfix.maillog());
    return match?.[1];
  });

/** The maillog line of the first delivery attempt of `queueId` to `address`. */
const deliveryLine = (queueId: string, address: string) =>
  s.waitFor(`the delivery of ${queueId}`, async () =>
    (await s.postfix.maillog())
      .split('\n')
      .find((line) => line.includes(`${queueId}: to=<${address}>`) && line.includes('status=')),
  );

test('a delivery status notification for mail an inbox sent is discarded, not stored in that inbox', async () => {
  const listed = await s.provision(['allowed.example']);
  const open = await s.provision();
  // The notice would carry the message back, headers and all (RET=FULL), past the sender list.
  const message = plainMessage({ to: open.address, from: 'evil@unlisted.example', subject: 'smuggled' });
  const replies = await s.send({
    from: listed.address,
    to: [open.address],
    message,
    mailParams: 'RET=FULL',
    rcptParams: 'NOTIFY=SUCCESS',
  });
  const queueId = queuedAs(replies);
  assert.ok(queueId, JSON.stringify(replies));
  await deliveryLine(queueId, open.address);
  assert.equal(await messageRows(open), 1);

  const notice = await noticeOf(queueId, 'delivery status notification');
  const line = await deliveryLine(notice, listed.address);
  assert.match(line, DISCARDED, line);
  assert.equal(await messageRows(listed), 0);
});

test('a bounce of mail an inbox sent is discarded, not stored in that inbox', async () => {
  const sender = await s.provision();
  const recipient = await s.provision();
  // The receiver is down: the message is deferred, and at once expired (maximal_queue_lifetime = 0),
  // which returns it to its sender. The bounce needs no receiver: it is discarded at once. (Routed to
  // the receiver, it was deferred, and stored once the receiver was back.)
  await s.stopDaemon('lmtp');
  try {
    const replies = await s.send({
      from: sender.address,
      to: [recipient.address],
      message: plainMessage({ to: recipient.address, from: sender.address, subject: 'returned' }),
    });
    const queueId = queuedAs(replies);
    assert.ok(queueId, JSON.stringify(replies));
    const notice = await noticeOf(queueId, 'non-delivery notification');
    const line = await deliveryLine(notice, sender.address);
    assert.match(line, DISCARDED, line);
  } finally {
    await s.startDaemon('lmtp');
  }
  assert.equal(await messageRows(sender), 0);
});

test('mail submitted on the host with sendmail is refused, and nothing is stored', async () => {
  const inbox = await s.provision();
  const sendmail = promisify(execFile)('/usr/sbin/sendmail', [
    '-C',
    s.postfix.dirs.configDirectory,
    '-f',
    'someone@allowed.test',
    '--',
    inbox.address,
  ]);
  // sendmail may refuse, and exit, before it reads the message: our write then fails with EPIPE.
  sendmail.child.stdin?.on('error', (error: NodeJS.ErrnoException) => {
    if (error.code !== 'EPIPE') throw error;
  });
  sendmail.child.stdin?.end(plainMessage({ to: inbox.address, subject: 'local' }));
  await assert.rejects(sendmail, /not allowed to submit mail/);
  const queued = await s.postfix.queue();
  assert.equal(queued.filter((e) => e.recipients.some((r) => r.address === inbox.address)).length, 0);
  assert.equal(await messageRows(inbox), 0);
});
