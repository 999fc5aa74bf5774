/**
 * Failures on our side never lose mail and never refuse it permanently (DESIGN decisions 1, 4, 5;
 * MAIL-FACTS B.5, F.6): with the policy daemon down, or the milter down, the sender gets a 4xx and
 * nothing is recorded; with Postgres refusing connections, the milter cannot reserve (4xx at end of
 * data), and the LMTP receiver answers 4xx, so Postfix keeps the accepted message deferred and delivers
 * it once the database is back: stored once, no bounce. A 5xx from the receiver's side (which it must
 * never send) is deferred too, by soft_bounce on Postfix's lmtp service, and never bounced.
 *
 * "Postgres down" is real and touches only this file's database: ALLOW_CONNECTIONS false plus
 * pg_terminate_backend of its sessions, from an admin connection; then allowed again.
 *
 * Mail an admin requeues with `postsuper -r` goes back through pickup and is still delivered.
 *
 * Idempotency of one queue id delivered twice over LMTP is covered in test/lmtp/receiver.test.ts and
 * test/lmtp/database-failure.test.ts.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { once } from 'node:events';
import { createServer, type Socket } from 'node:net';
import { after, before, test } from 'node:test';
import { promisify } from 'node:util';
import type { ProvisionedInbox } from '../../src/core/inbox-service.ts';
import { asAdmin } from '../support/database.ts';
import { allowConnections, endSessions } from '../support/database-outage.ts';
import { CLIENTS } from '../support/dns-zone.ts';
import {
  MAIL_DOMAIN,
  type MailStack,
  plainMessage,
  startMailStack,
  startRetryingSender,
} from '../support/mail-stack.ts';
import {
  queuedAs,
  type Reply,
  SmtpClient,
  sendMail,
  type TransactionReplies,
} from '../support/smtp-client.ts';

let s: MailStack;
before(async () => {
  s = await startMailStack({ env: { POLL_RATE_BURST: '100000' } });
});
after(async () => {
  await allowAgain().catch(() => undefined);
  await s?.close();
});

/** The test database refuses new connections and loses the ones it had. */
async function refuseConnections(): Promise<void> {
  await asAdmin(async (client) => {
    await allowConnections(client, s.database.name, false);
    await endSessions(client, s.database.name);
  });
}

async function allowAgain(): Promise<void> {
  if (s) await asAdmin((client) => allowConnections(client, s.database.name, true));
}

const status = async (inbox: ProvisionedInbox) => {
  const r = await s.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.owner });
  assert.equal(r.status, 200, r.text);
  return r.json;
};
const poll = async (inbox: ProvisionedInbox) => {
  const r = await s.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, { token: inbox.credentials.owner });
  assert.equal(r.status, 200, r.text);
  return r.json;
};

/** Every reply of a session, in order. */
const transcript = (r: TransactionReplies): Reply[] =>
  [r.greeting, r.ehlo, r.mail, ...r.rcpt, r.data, r.end].filter((x): x is Reply => x !== undefined);

/** Nothing about the inbox changed: no message, no reservation, no event. */
async function assertUntouched(inbox: ProvisionedInbox): Promise<void> {
  const st = await status(inbox);
  assert.deepEqual([st.message_count, st.quota_used_bytes, st.rejection_count], [0, 0, 0]);
  const p = await poll(inbox);
  assert.deepEqual([p.messages.length, p.rejections.length], [0, 0]);
}

/** From 127.0.0.5, whose PTR names a host without an A record: Postfix has no verified name for it. */
const POLICY_DOWN_AT_CONNECT =
  '451 4.3.5 <unknown[127.0.0.5]>: Client host rejected: Server configuration problem';
const MILTER_DOWN = '451 4.7.1 Service unavailable - try again later';

/** A session from 127.0.0.3 brought up to an accepted RCPT. */
async function openTransaction(to: string): Promise<SmtpClient> {
  const { client, greeting } = await SmtpClient.open(s.smtpPort, { localAddress: '127.0.0.3' });
  assert.equal(greeting.code, 220, greeting.text);
  assert.equal((await client.command('EHLO mail.sender.test')).code, 250);
  assert.equal((await client.command('MAIL FROM:<sender@allowed.test>')).code, 250);
  const rcpt = await client.command(`RCPT TO:<${to}>`);
  assert.equal(rcpt.code, 250, rcpt.text);
  return client;
}

test('policy daemon down: 451 4.3.5 (Postfix default_action), never a 5xx, at CONNECT for a client without a verified name, at RCPT for a named one, and nothing is recorded', async () => {
  const inbox = await s.provision();
  await s.stopDaemon('policy');
  let unnamed: TransactionReplies;
  let named: TransactionReplies;
  try {
    const message = plainMessage({ to: inbox.address });
    unnamed = await s.send({ to: [inbox.address], message, localAddress: CLIENTS.unconfirmedPtr });
    named = await s.send({ to: [inbox.address], message });
  } finally {
    await s.startDaemon('policy');
  }
  // smtpd_delay_reject = no: the CONNECT-stage policy query fails first, so the greeting carries it.
  assert.equal(unnamed.greeting.text, POLICY_DOWN_AT_CONNECT);
  assert.equal(unnamed.mail, undefined);
  // A client with a verified name is asked about only at RCPT (postfix/README.md: check_client_access).
  assert.equal(named.greeting.code, 220);
  assert.deepEqual(
    named.rcpt.map((r) => r.text),
    [`451 4.3.5 <${inbox.address}>: Recipient address rejected: Server configuration problem`],
  );
  await assertUntouched(inbox);
  assert.ok(await s.postfix.queueEmpty());
});

test('policy daemon gone after CONNECT: RCPT gets 451 4.3.5 Server configuration problem, and nothing is recorded', async () => {
  const inbox = await s.provision();
  const { client, greeting } = await SmtpClient.open(s.smtpPort, { localAddress: '127.0.0.3' });
  let rcpt: Reply;
  try {
    assert.equal(greeting.code, 220, greeting.text);
    assert.equal((await client.command('EHLO mail.sender.test')).code, 250);
    assert.equal((await client.command('MAIL FROM:<sender@allowed.test>')).code, 250);
    await s.stopDaemon('policy');
    try {
      rcpt = await client.command(`RCPT TO:<${inbox.address}>`);
    } finally {
      await s.startDaemon('policy');
    }
  } finally {
    await client.quit();
  }
  assert.equal(
    rcpt.text,
    `451 4.3.5 <${inbox.address}>: Recipient address rejected: Server configuration problem`,
  );
  await assertUntouched(inbox);
  assert.ok(await s.postfix.queueEmpty());
});

test('milter down: MAIL FROM gets 451 4.7.1 Service unavailable - try again later (milter_default_action = tempfail), and nothing is recorded or queued', async () => {
  const inbox = await s.provision();
  await s.stopDaemon('milter');
  let r: TransactionReplies;
  try {
    r = await s.send({ to: [inbox.address], message: plainMessage({ to: inbox.address }) });
  } finally {
    await s.startDaemon('milter');
  }
  assert.equal(r.greeting.code, 220);
  assert.equal(r.mail?.text, MILTER_DOWN);
  assert.deepEqual(r.rcpt, []);
  await assertUntouched(inbox);
  assert.ok(await s.postfix.queueEmpty());
});

test("milter gone in the middle of a transaction: DATA gets 451 4.7.1 Service unavailable - try again later (Postfix waits for the milter's reply to DATA), and nothing is queued", async () => {
  const inbox = await s.provision();
  const client = await openTransaction(inbox.address);
  let replies: Reply[];
  try {
    await s.stopDaemon('milter'); // ends the session's milter connection at once: no transaction there yet
    try {
      const { start, end } = await client.data(plainMessage({ to: inbox.address }));
      replies = end ? [start, end] : [start];
    } finally {
      await s.startDaemon('milter');
    }
  } finally {
    await client.quit();
  }
  assert.deepEqual(
    replies.map((r) => r.text),
    [MILTER_DOWN],
  );
  await assertUntouched(inbox);
  assert.ok(await s.postfix.queueEmpty());
});

test('Postgres unavailable: the milter answers 4xx at end of data, the receiver 4xx, Postfix keeps the accepted message deferred and delivers it once when the database is back, with no bounce', async () => {
  const inbox = await s.provision();
  const accepted = plainMessage({ to: inbox.address, subject: 'held', messageId: '<held@allowed.test>' });

  // 1. The milter reserves the message while the database is up; the receiver is down, so it waits.
  await s.stopDaemon('lmtp');
  let queueId: string | undefined;
  let duringOutage: TransactionReplies | undefined;
  let endOfData: Reply | undefined;
  try {
    const sent = await s.send({ to: [inbox.address], message: accepted });
    queueId = queuedAs(sent);
    assert.ok(queueId, sent.end?.text);
    await s.waitFor('the message deferred (receiver down)', async () =>
      (await s.postfix.queue()).find((e) => e.queueId === queueId && e.recipients[0]?.delayReason),
    );
    const reserved = await status(inbox);
    assert.equal(reserved.message_count, 1);
    const pending = await openTransaction(inbox.address);

    // 2. The database goes away.
    await refuseConnections();
    try {
      // A transaction past RCPT: the milter cannot reserve at end of data.
      try {
        const { start, end } = await pending.data(plainMessage({ to: inbox.address, subject: 'late' }));
        assert.equal(start.code, 354);
        endOfData = end;
      } finally {
        await pending.quit();
      }
      // A new session: whatever stage refuses it, it is a 4xx.
      duringOutage = await s.send({
        to: [inbox.address],
        message: plainMessage({ to: inbox.address, subject: 'during' }),
      });

      // 3. The receiver comes back while the database is still away: it answers 4xx, Postfix defers.
      await s.startDaemon('lmtp');
      await s.postfix.flush();
      const deferred = await s.waitFor('the receiver deferring the message', async () => {
        const entry = (await s.postfix.queue()).find((e) => e.queueId === queueId);
        const reason = entry?.recipients[0]?.delayReason ?? '';
        return reason.includes('451 4.3.0') ? reason : undefined;
      });
      assert.match(
        deferred,
        new RegExp(
          `said: 451 4\\.3\\.0 ${MAIL_DOMAIN.replace('.', '\\.')}: temporary failure storing the message, try again later`,
        ),
      );
    } finally {
      await allowAgain();
    }
  } finally {
    await s.startDaemon('lmtp').catch(() => undefined);
  }

  assert.equal(endOfData?.text, MILTER_DOWN, 'the milter could not decide: tempfail');
  // A new session during the outage is turned away at RCPT: the policy daemon cannot look the inbox
  // up, drops the query unanswered, and Postfix applies its default_action. Never a 5xx.
  const outage = transcript(duringOutage as TransactionReplies);
  assert.ok(
    outage.every((reply) => reply.code < 500),
    JSON.stringify(outage),
  );
  assert.equal(
    duringOutage?.rcpt[0]?.text,
    `451 4.3.5 <${inbox.address}>: Recipient address rejected: Server configuration problem`,
  );
  assert.equal(duringOutage?.end, undefined);

  // 4. The database is back: the next retry stores the message, once.
  await s.postfix.flush();
  const polled = await s.waitFor('the held message stored', async () => {
    const p = await poll(inbox);
    return p.messages.length > 0 ? p : undefined;
  });
  await s.waitFor('an empty queue', async () => ((await s.postfix.queueEmpty()) ? true : undefined));
  const final = await poll(inbox);
  assert.equal(final.messages.length, 1);
  assert.equal(final.rejections.length, 0);
  const [m] = polled.messages;
  assert.equal(m.internet_message_id, '<held@allowed.test>');
  const download = await s.api.get(m.url, { token: inbox.credentials.reader });
  assert.ok(
    download.bytes.subarray(-accepted.length).equals(accepted),
    'the download ends with the message sent',
  );
  const st = await status(inbox);
  assert.deepEqual([st.message_count, st.quota_used_bytes, st.rejection_count], [1, m.size_bytes, 0]);

  const log = (await s.postfix.maillog()).split('\n').filter((l) => l.includes(`${queueId}:`));
  assert.ok(
    log.some((l) => /status=deferred .*451 4\.3\.0/.test(l)),
    log.join('\n'),
  );
  assert.equal(log.filter((l) => l.includes('status=sent')).length, 1, log.join('\n'));
  const whole = await s.postfix.maillog();
  assert.doesNotMatch(whole, /status=bounced/);
  assert.doesNotMatch(whole, /sender non-delivery notification/);
});

test('a real sending MTA turned away with a 4xx while Postgres is down delivers its message once the database is back', async () => {
  // The sessions refused during the outage above are the test's own; here a second Postfix plays the
  // sender, as on the Internet: it keeps the message and retries (DESIGN table review).
  const inbox = await s.provision();
  const sender = await startRetryingSender(s, 'failures-sender');
  try {
    const message = plainMessage({
      to: inbox.address,
      subject: 'retried',
      messageId: '<outage@allowed.test>',
    });
    await refuseConnections();
    let senderQueueId: string | undefined;
    try {
      const injected = await sendMail(sender.port, {
        from: 'sender@allowed.test',
        to: [inbox.address],
        message,
      });
      senderQueueId = queuedAs(injected);
      assert.ok(senderQueueId, injected.end?.text);
      const deferred = await s.waitFor('the sender deferring on our 4xx', async () => {
        const [entry] = await sender.instance.queue();
        const reason = entry?.recipients[0]?.delayReason ?? '';
        return /said: 4\d\d /.test(reason) ? reason : undefined;
      });
      assert.match(deferred, /said: 451 4\.3\.5 /, 'the policy daemon could not look the inbox up');
    } finally {
      await allowAgain();
    }
    await sender.instance.flush();
    await s.waitFor('the message stored', async () =>
      (await poll(inbox)).messages.length > 0 ? true : undefined,
    );
    await s.waitFor('the sender queue to drain', async () =>
      (await sender.instance.queueEmpty()) ? true : undefined,
    );
    const final = await poll(inbox);
    assert.deepEqual(
      final.messages.map((m: { internet_message_id: string }) => m.internet_message_id),
      ['<outage@allowed.test>'],
    );
    assert.deepEqual(final.rejections, []);
    const log = (await sender.instance.maillog()).split('\n').filter((l) => l.includes(`${senderQueueId}:`));
    assert.equal(log.filter((l) => l.includes('status=sent')).length, 1, log.join('\n'));
    assert.ok(
      log.some((l) => l.includes('status=deferred')),
      log.join('\n'),
    );
    assert.doesNotMatch(await sender.instance.maillog(), /status=bounced/);
  } finally {
    await sender.stop();
  }
});

/**
 * An LMTP server in the receiver's place that refuses every sender with a 5xx: what smtp-server, under
 * our receiver, did to some senders Postfix had accepted (src/lmtp/mail-from.ts).
 */
async function refusingReceiver(port: number): Promise<{ close(): Promise<void> }> {
  const sockets = new Set<Socket>();
  const server = createServer((socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    socket.on('error', () => {});
    socket.write('220 refusing.test LMTP\r\n');
    let buffer = '';
    socket.on('data', (data) => {
      buffer += data.toString('latin1');
      for (let end = buffer.indexOf('\r\n'); end !== -1; end = buffer.indexOf('\r\n')) {
        const verb = buffer.slice(0, end).split(' ')[0]?.toUpperCase();
        buffer = buffer.slice(end + 2);
        if (verb === 'LHLO')
          socket.write('250-refusing.test\r\n250-PIPELINING\r\n250 XFORWARD NAME ADDR PROTO HELO IDENT\r\n');
        else if (verb === 'XFORWARD' || verb === 'RSET') socket.write('250 OK\r\n');
        else if (verb === 'MAIL') socket.write('501 5.1.7 Bad sender address syntax\r\n');
        else if (verb === 'QUIT') socket.end('221 bye\r\n');
        else socket.write('503 5.5.1 Bad sequence of commands\r\n');
      }
    });
  });
  server.listen(port, '127.0.0.1');
  await once(server, 'listening');
  return {
    async close() {
      for (const socket of sockets) socket.destroy();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

test("a 5xx from the receiver's side defers the message (soft_bounce on Postfix's lmtp service): no bounce, delivered once the receiver takes it", async () => {
  const inbox = await s.provision();
  const message = plainMessage({
    to: inbox.address,
    subject: 'refused once',
    messageId: '<refused@allowed.test>',
  });
  await s.stopDaemon('lmtp');
  let queueId: string | undefined;
  try {
    const listen = s.config.lmtpListen;
    assert.ok('port' in listen, 'the mail stack runs the receiver on TCP');
    const refusing = await refusingReceiver(listen.port);
    try {
      const sent = await s.send({ to: [inbox.address], message });
      queueId = queuedAs(sent);
      assert.ok(queueId, sent.end?.text);
      const reason = await s.waitFor('the message deferred after the 5xx', async () => {
        const entry = (await s.postfix.queue()).find((e) => e.queueId === queueId);
        const text = entry?.recipients[0]?.delayReason ?? '';
        return text.includes('501 5.1.7') ? text : undefined;
      });
      assert.match(reason, /said: 501 5\.1\.7 Bad sender address syntax/);
    } finally {
      await refusing.close();
    }
  } finally {
    await s.startDaemon('lmtp');
  }
  await s.postfix.flush();
  const polled = await s.waitFor('the message stored', async () => {
    const p = await poll(inbox);
    return p.messages.length > 0 ? p : undefined;
  });
  assert.equal(polled.messages[0].internet_message_id, '<refused@allowed.test>');
  await s.waitFor('an empty queue', async () => ((await s.postfix.queueEmpty()) ? true : undefined));
  const log = (await s.postfix.maillog()).split('\n').filter((l) => l.includes(`${queueId}:`));
  // Postfix logs a deferral that soft_bounce made as SOFTBOUNCE, with the DSN class turned to 4.
  assert.ok(
    log.some((l) => /dsn=4\.1\.7, status=SOFTBOUNCE .*said: 501 5\.1\.7/.test(l)),
    log.join('\n'),
  );
  assert.equal(log.filter((l) => l.includes('status=sent')).length, 1, log.join('\n'));
  assert.ok(!log.some((l) => /status=bounced|sender non-delivery notification/.test(l)), log.join('\n'));
  assert.equal((await poll(inbox)).messages.length, 1);
});

test('accepted mail requeued with postsuper -r (through pickup) is still delivered', async () => {
  // pickup must stay on the normal cleanup: routed through the notices' cleanup (postfix/README.md),
  // this copy was discarded as "not received by SMTP" (a review found it).
  const inbox = await s.provision();
  await s.stopDaemon('lmtp');
  let queueId: string | undefined;
  try {
    const replies = await s.send({ to: [inbox.address], message: plainMessage({ to: inbox.address }) });
    queueId = queuedAs(replies);
    assert.ok(queueId, JSON.stringify(replies));
    const deferred = `${queueId}: to=<${inbox.address}>`;
    await s.waitFor('the deferral', async () =>
      (await s.postfix.maillog()).includes(deferred) ? true : undefined,
    );
    await promisify(execFile)('/usr/sbin/postsuper', ['-c', s.postfix.dirs.configDirectory, '-r', queueId]);
  } finally {
    await s.startDaemon('lmtp');
  }
  // The copy waits in maildrop for pickup's next wakeup (60 s): wake pickup, and the queue manager,
  // until it is delivered. A kick can fail (SIGPIPE) while pickup is between wakeups; the next one works.
  const kick = () =>
    promisify(execFile)('/usr/sbin/postkick', [
      '-c',
      s.postfix.dirs.configDirectory,
      'public',
      'pickup',
      'W',
    ]).catch(() => undefined);
  const line = await s.waitFor('the requeued delivery', async () => {
    const delivered = (await s.postfix.maillog())
      .split('\n')
      .find(
        (l) => l.includes(`to=<${inbox.address}>`) && l.includes('status=sent') && !l.includes(`${queueId}:`),
      );
    if (!delivered) await Promise.all([kick(), s.postfix.flush()]);
    return delivered;
  });
  assert.match(line, /status=sent \(250 2\.0\.0 msg_\w+ stored\)/, line);
});
