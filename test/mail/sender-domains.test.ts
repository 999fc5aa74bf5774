/**
 * sender_domains end to end (contract section 2 "Rejection event", section 4 provision admission rule,
 * PUT sender-domains and "Receiving mail"; DESIGN decisions 2 and 3): real SMTP into the real Postfix,
 * the milter's 451 at end of data, the policy daemon's 452 for a recipient that needs its own
 * transaction, and a second Postfix (test/support/sender-postfix.ts) as the real retrying sender.
 *
 * Domains (test/support/dns-zone.ts): allowed.test and other.test sign and pass SPF under p=reject;
 * lax.test is unsigned with SPF `?all` and p=none, so its mail is never authenticated.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import type { ProvisionedInbox } from '../../src/core/inbox-service.ts';
import { dkimSignFor } from '../support/dns-zone.ts';
import { type MailStack, plainMessage, startMailStack, startRetryingSender } from '../support/mail-stack.ts';
import type { SenderPostfix } from '../support/sender-postfix.ts';
import { SmtpClient, sendMail } from '../support/smtp-client.ts';

const NOT_ALLOWED = '451 4.7.1 svc.test: sender not allowed by this inbox, try again later';
const SEPARATE = 'Recipient address rejected: svc.test: send this recipient in a separate transaction';

let s: MailStack;
let sender: SenderPostfix | undefined;

before(async () => {
  // The waits below poll the API every 100 ms while the fake clock stands still (no refill).
  s = await startMailStack({ env: { POLL_RATE_BURST: '100000' } });
  sender = await startRetryingSender(s, 'sender-domains');
});

after(async () => {
  try {
    await sender?.stop();
  } finally {
    await s?.close();
  }
});

// biome-ignore lint/suspicious/noExplicitAny: poll JSON as served (validated against OpenAPI by the harness)
type Poll = any;

async function poll(inbox: ProvisionedInbox): Promise<Poll> {
  const r = await s.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, { token: inbox.credentials.owner });
  assert.equal(r.status, 200, r.text);
  return r.json;
}

/** The poll once it lists at least `count` messages. */
function messagesIn(inbox: ProvisionedInbox, count = 1): Promise<Poll> {
  return s.waitFor(`${count} message(s) in ${inbox.inbox_id}`, async () => {
    const p = await poll(inbox);
    return p.messages.length >= count ? p : undefined;
  });
}

async function download(inbox: ProvisionedInbox, url: string): Promise<Buffer> {
  const r = await s.api.get(url, { token: inbox.credentials.owner });
  assert.equal(r.status, 200);
  return r.bytes;
}

const queuedAs = /^250 2\.0\.0 Ok: queued as (\w+)$/;

function queueIdOf(text: string | undefined): string {
  const id = queuedAs.exec(text ?? '')?.[1];
  assert.ok(id, `end of data was ${text}`);
  return id;
}

/**
 * Lines of the receiving Postfix's maillog for LMTP deliveries to `address`, once there is one (Postfix
 * logs the delivery just after the receiver has stored the message and answered).
 */
function lmtpDeliveries(address: string): Promise<string[]> {
  return s.waitFor(`the LMTP delivery to ${address} in the maillog`, async () => {
    const lines = (await s.postfix.maillog())
      .split('\n')
      .filter((l) => l.includes('/lmtp[') && l.includes(`to=<${address}>`) && l.includes('status=sent'));
    return lines.length > 0 ? lines : undefined;
  });
}

test('an inbox listing allowed.test takes authenticated mail from allowed.test and from its subdomains', async () => {
  const inbox = await s.provision(['allowed.test']);
  // DMARC passes through the aligned DKIM signature alone: the envelope is in lax.test.
  const signed = await dkimSignFor(
    'allowed.test',
    plainMessage({ to: inbox.address, from: 'alice@allowed.test', messageId: '<dkim@allowed.test>' }),
  );
  const viaDkim = await s.send({ from: 'bounce@lax.test', to: [inbox.address], message: signed });
  assert.match(viaDkim.end?.text ?? '', queuedAs, JSON.stringify(viaDkim));
  // DMARC passes through aligned SPF alone: unsigned, envelope in allowed.test.
  const unsigned = plainMessage({
    to: inbox.address,
    from: 'bob@allowed.test',
    messageId: '<spf@allowed.test>',
  });
  const viaSpf = await s.send({ from: 'bounces@allowed.test', to: [inbox.address], message: unsigned });
  assert.match(viaSpf.end?.text ?? '', queuedAs, JSON.stringify(viaSpf));
  // news.allowed.test publishes nothing itself: its DMARC policy is the organizational domain's, and a
  // d=allowed.test signature is aligned with it under relaxed alignment; the list admits subdomains.
  const sub = await dkimSignFor(
    'allowed.test',
    plainMessage({ to: inbox.address, from: 'news@news.allowed.test', messageId: '<sub@news.allowed.test>' }),
  );
  const viaSub = await s.send({ from: 'bounce@lax.test', to: [inbox.address], message: sub });
  assert.match(viaSub.end?.text ?? '', queuedAs, JSON.stringify(viaSub));

  const p = await messagesIn(inbox, 3);
  const byId = new Map(p.messages.map((m: Poll) => [m.internet_message_id, m.authentication]));
  assert.deepEqual(byId.get('<dkim@allowed.test>'), {
    dmarc: { result: 'pass', domain: 'allowed.test' },
    dkim: { result: 'pass', domain: 'allowed.test' },
    spf: { result: 'neutral', domain: 'lax.test' },
  });
  assert.deepEqual(byId.get('<spf@allowed.test>'), {
    dmarc: { result: 'pass', domain: 'allowed.test' },
    dkim: { result: 'none', domain: null },
    spf: { result: 'pass', domain: 'allowed.test' },
  });
  assert.deepEqual(byId.get('<sub@news.allowed.test>'), {
    dmarc: { result: 'pass', domain: 'news.allowed.test' },
    dkim: { result: 'pass', domain: 'allowed.test' },
    spf: { result: 'neutral', domain: 'lax.test' },
  });
  assert.deepEqual(p.rejections, []);
  assert.equal(p.inbox.rejection_count, 0);
});

test('a domain without a DMARC record is authenticated by an aligned DKIM signature alone (contract section 4)', async () => {
  const inbox = await s.provision(['keyonly.test']);
  // The envelope is in lax.test, so SPF does not align: only the signature speaks for keyonly.test.
  const signed = await dkimSignFor(
    'keyonly.test',
    plainMessage({ to: inbox.address, from: 'alice@keyonly.test', messageId: '<signed@keyonly.test>' }),
  );
  const viaDkim = await s.send({ from: 'bounce@lax.test', to: [inbox.address], message: signed });
  assert.match(viaDkim.end?.text ?? '', queuedAs, JSON.stringify(viaDkim));
  // The same author unsigned is not authenticated: DMARC has no policy to pass.
  const unsigned = plainMessage({ to: inbox.address, from: 'alice@keyonly.test' });
  const refused = await s.send({ from: 'bounce@lax.test', to: [inbox.address], message: unsigned });
  assert.equal(refused.end?.text, NOT_ALLOWED);

  const p = await messagesIn(inbox, 1);
  assert.deepEqual(p.messages[0].authentication, {
    dmarc: { result: 'none', domain: 'keyonly.test' },
    dkim: { result: 'pass', domain: 'keyonly.test' },
    spf: { result: 'neutral', domain: 'lax.test' },
  });
  assert.deepEqual(
    p.rejections.map((r: { reason: string; sender_domain: string | null }) => [r.reason, r.sender_domain]),
    [['sender_not_allowed', null]],
  );
});

test('a listed subdomain does not admit its parent, and a name is matched by labels, not by its ending', async () => {
  const sub = await s.provision(['news.allowed.test']);
  const parent = await dkimSignFor('allowed.test', plainMessage({ to: sub.address, from: 'a@allowed.test' }));
  const toSub = await s.send({ from: 'bounce@allowed.test', to: [sub.address], message: parent });
  assert.equal(toSub.end?.text, NOT_ALLOWED);

  const listed = await s.provision(['allowed.test']);
  // xallowed.test passes DMARC through aligned SPF; it ends in "allowed.test" but is not under it.
  const lookalike = plainMessage({ to: listed.address, from: 'a@xallowed.test' });
  const toListed = await s.send({ from: 'bounce@xallowed.test', to: [listed.address], message: lookalike });
  assert.equal(toListed.end?.text, NOT_ALLOWED);

  const events = async (inbox: ProvisionedInbox) =>
    (await poll(inbox)).rejections.map((r: { reason: string; sender_domain: string }) => [
      r.reason,
      r.sender_domain,
    ]);
  assert.deepEqual(await events(sub), [['sender_not_allowed', 'allowed.test']]);
  assert.deepEqual(await events(listed), [['sender_not_allowed', 'xallowed.test']]);
});

test('unauthenticated mail (From: lax.test) gets 451 4.7.1 and a sender_not_allowed event with sender_domain null', async () => {
  const inbox = await s.provision(['allowed.test']);
  const message = plainMessage({ to: inbox.address, from: 'news@lax.test', messageId: '<unauth@lax.test>' });
  const replies = await s.send({ from: 'news@lax.test', to: [inbox.address], message });
  assert.equal(replies.rcpt[0]?.code, 250);
  assert.equal(replies.end?.text, NOT_ALLOWED);

  const p = await poll(inbox);
  assert.deepEqual(p.messages, []);
  assert.deepEqual(p.rejections, [
    {
      at: s.clock.now().toISOString(),
      envelope_from: 'news@lax.test',
      reason: 'sender_not_allowed',
      sender_domain: null,
      size_bytes: message.length,
    },
  ]);
  assert.equal(p.inbox.rejection_count, 1);
  assert.equal(p.inbox.message_count, 0);
  assert.equal(p.inbox.quota_used_bytes, 0);
});

test('a listed domain is not enough: unauthenticated mail from listed lax.test gets 451 with sender_domain null', async () => {
  const inbox = await s.provision(['lax.test']);
  const message = plainMessage({ to: inbox.address, from: 'news@lax.test' });
  const replies = await s.send({ from: 'news@lax.test', to: [inbox.address], message });
  assert.equal(replies.end?.text, NOT_ALLOWED);
  const p = await poll(inbox);
  assert.deepEqual(p.messages, []);
  assert.equal(p.rejections.length, 1);
  assert.equal(p.rejections[0].sender_domain, null);
  assert.equal(p.rejections[0].reason, 'sender_not_allowed');
});

test('authenticated mail from an unlisted domain (other.test) gets 451 4.7.1 and an event naming other.test', async () => {
  const inbox = await s.provision(['allowed.test']);
  const message = await dkimSignFor(
    'other.test',
    plainMessage({ to: inbox.address, from: 'bob@other.test' }),
  );
  const replies = await s.send({ from: 'bounce@other.test', to: [inbox.address], message });
  assert.equal(replies.end?.text, NOT_ALLOWED);

  const p = await poll(inbox);
  assert.deepEqual(p.messages, []);
  assert.deepEqual(p.rejections, [
    {
      at: s.clock.now().toISOString(),
      envelope_from: 'bounce@other.test',
      reason: 'sender_not_allowed',
      sender_domain: 'other.test',
      size_bytes: message.length,
    },
  ]);
  assert.equal(p.inbox.rejection_count, 1);
});

test('sender_not_allowed refusals without a usable Message-ID are one event each: an empty field or none is no Message-ID', async () => {
  const inbox = await s.provision(['allowed.test']);
  const withField = (n: number) =>
    plainMessage({ to: inbox.address, from: 'news@lax.test', messageId: '', subject: `empty ${n}` });
  const withoutField = Buffer.from(
    withField(3)
      .toString('latin1')
      .replace(/^Message-ID:[^\r]*\r\n/m, ''),
    'latin1',
  );
  assert.doesNotMatch(withoutField.toString('latin1'), /Message-ID/i);
  for (const message of [withField(1), withField(2), withoutField]) {
    const replies = await s.send({ from: 'news@lax.test', to: [inbox.address], message });
    assert.equal(replies.end?.text, NOT_ALLOWED);
  }
  const p = await poll(inbox);
  assert.deepEqual(
    p.rejections.map((e: { reason: string; sender_domain: string | null }) => [e.reason, e.sender_domain]),
    [
      ['sender_not_allowed', null],
      ['sender_not_allowed', null],
      ['sender_not_allowed', null],
    ],
  );
  assert.equal(p.inbox.rejection_count, 3);
});

test('after PUT sender-domains adds other.test, the retrying sender delivers on its next try: one message, one event, every attempt counted', async () => {
  assert.ok(sender);
  const inbox = await s.provision(['allowed.test']);
  const token = inbox.credentials.owner;
  const message = await dkimSignFor(
    'other.test',
    plainMessage({ to: inbox.address, from: 'Bob <bob@other.test>', messageId: '<retry-1@other.test>' }),
  );
  const injected = await sendMail(sender.port, { from: 'bounce@other.test', to: [inbox.address], message });
  const senderQueueId = queueIdOf(injected.end?.text);

  // The MX answered 451 at end of data: the sender keeps the message, deferred with our reply.
  const deferred = await s.waitFor('the 451 in the sender queue', async () => {
    const [entry] = (await sender?.instance.queue()) ?? [];
    const reason = entry?.recipients[0]?.delayReason ?? '';
    // Between its retries (fast here) it may be in the active queue, with the last reason kept.
    return reason.includes('451') && entry?.queueName === 'deferred' ? entry : undefined;
  });
  assert.equal(deferred.queueId, senderQueueId);
  assert.equal(deferred.queueName, 'deferred');
  assert.match(
    deferred.recipients[0]?.delayReason ?? '',
    /said: 451 4\.7\.1 svc\.test: sender not allowed by this inbox, try again later \(in reply to end of DATA command\)/,
  );

  // Let it retry at least once more while still refused: each attempt counts, the event stays one.
  const refused = await s.waitFor('a second refused attempt', async () => {
    const p = await poll(inbox);
    return p.inbox.rejection_count >= 2 ? p : undefined;
  });
  assert.equal(refused.rejections.length, 1);
  assert.equal(refused.rejections[0].sender_domain, 'other.test');
  assert.deepEqual(refused.messages, []);

  const put = await s.api.put(`/v1/inboxes/${inbox.inbox_id}/sender-domains`, {
    token,
    body: { sender_domains: ['other.test', 'allowed.test'] },
  });
  assert.equal(put.status, 200, put.text);
  assert.deepEqual(put.json.sender_domains, ['allowed.test', 'other.test']);
  await sender.instance.flush();

  await messagesIn(inbox);
  await s.waitFor('the sender queue to drain', async () =>
    (await sender?.instance.queueEmpty()) ? true : undefined,
  );
  const delivered = await poll(inbox);
  assert.equal(delivered.messages.length, 1, 'arrived once');
  const [m] = delivered.messages;
  assert.equal(m.internet_message_id, '<retry-1@other.test>');
  assert.equal(m.envelope_from, 'bounce@other.test');
  assert.deepEqual(m.from, { name: 'Bob', address: 'bob@other.test' });
  assert.deepEqual(m.authentication, {
    dmarc: { result: 'pass', domain: 'other.test' },
    dkim: { result: 'pass', domain: 'other.test' },
    spf: { result: 'pass', domain: 'other.test' },
  });
  const raw = await download(inbox, m.url);
  assert.ok(
    raw.subarray(raw.length - message.length).equals(message),
    'the message as injected ends the download',
  );

  // Still the one event of the first refusal: retries of one Message-ID never add another.
  assert.deepEqual(delivered.rejections, refused.rejections);
  const log = await sender.instance.maillog();
  const attempts = log.split('\n').filter((l) => l.includes(`${senderQueueId}: to=<${inbox.address}>`));
  const refusals = attempts.filter((l) => l.includes('status=deferred') && l.includes(NOT_ALLOWED));
  const sent = attempts.filter((l) => l.includes('status=sent'));
  assert.equal(sent.length, 1, attempts.join('\n'));
  assert.ok(refusals.length >= 2, attempts.join('\n'));
  assert.equal(
    delivered.inbox.rejection_count,
    refusals.length,
    'rejection_count counts every refused attempt',
  );
});

test('a message to two inboxes with equal verdicts arrives in one transaction, the same content in both', async () => {
  const a = await s.provision();
  const b = await s.provision();
  const message = plainMessage({ to: `${a.address}, ${b.address}`, from: 'carol@allowed.test' });
  const replies = await s.send({ from: 'bounces@allowed.test', to: [a.address, b.address], message });
  assert.deepEqual(
    replies.rcpt.map((r) => r.text),
    ['250 2.1.5 Ok', '250 2.1.5 Ok'],
  );
  assert.equal(replies.data?.code, 354);
  const queueId = queueIdOf(replies.end?.text);

  const [pa, pb] = [await messagesIn(a), await messagesIn(b)];
  const [da, db] = [await download(a, pa.messages[0].url), await download(b, pb.messages[0].url)];
  assert.ok(da.equals(db), 'both inboxes hold the same bytes');
  assert.ok(da.subarray(da.length - message.length).equals(message));
  assert.deepEqual(pa.messages[0].authentication, pb.messages[0].authentication);
  for (const inbox of [a, b]) {
    const lines = await lmtpDeliveries(inbox.address);
    assert.equal(lines.length, 1, lines.join('\n'));
    assert.match(lines[0] ?? '', new RegExp(`: ${queueId}: to=`));
  }
});

test('equal allowlists spelled differently still share one transaction', async () => {
  const a = await s.provision(['allowed.test', 'other.test']);
  const b = await s.provision(['OTHER.test.', 'Allowed.Test']);
  const message = await dkimSignFor(
    'allowed.test',
    plainMessage({ to: a.address, from: 'dave@allowed.test' }),
  );
  const replies = await s.send({ from: 'bounces@allowed.test', to: [a.address, b.address], message });
  assert.deepEqual(
    replies.rcpt.map((r) => r.code),
    [250, 250],
  );
  const queueId = queueIdOf(replies.end?.text);
  await messagesIn(a);
  await messagesIn(b);
  for (const inbox of [a, b]) {
    assert.match((await lmtpDeliveries(inbox.address))[0] ?? '', new RegExp(`: ${queueId}: to=`));
  }
});

test('a second recipient with a different allowlist gets 452 4.5.3 at RCPT and is sent in a separate transaction', async () => {
  const open = await s.provision();
  const listed = await s.provision(['allowed.test']);
  const message = await dkimSignFor(
    'allowed.test',
    plainMessage({
      to: `${open.address}, ${listed.address}`,
      from: 'erin@allowed.test',
      messageId: '<two@allowed.test>',
    }),
  );
  const replies = await s.send({ from: 'bounces@allowed.test', to: [open.address, listed.address], message });
  assert.equal(replies.rcpt[0]?.text, '250 2.1.5 Ok');
  assert.equal(replies.rcpt[1]?.text, `452 4.5.3 <${listed.address}>: ${SEPARATE}`);
  queueIdOf(replies.end?.text);
  await messagesIn(open);
  assert.deepEqual((await poll(listed)).messages, [], 'the 452 recipient got nothing in that transaction');

  // A real sender defers the 452 recipient and delivers it in a later transaction.
  assert.ok(sender);
  const first = await s.provision();
  const second = await s.provision(['allowed.test']);
  const relayed = await dkimSignFor(
    'allowed.test',
    plainMessage({
      to: `${first.address}, ${second.address}`,
      from: 'erin@allowed.test',
      messageId: '<split@allowed.test>',
    }),
  );
  const injected = await sendMail(sender.port, {
    from: 'bounces@allowed.test',
    to: [first.address, second.address],
    message: relayed,
  });
  queueIdOf(injected.end?.text);
  const [p1, p2] = [await messagesIn(first), await messagesIn(second)];
  assert.equal(p1.messages[0].internet_message_id, '<split@allowed.test>');
  assert.equal(p2.messages[0].internet_message_id, '<split@allowed.test>');
  assert.deepEqual(p2.rejections, [], 'a 452 is not a recorded rejection');

  const [l1, l2] = [await lmtpDeliveries(first.address), await lmtpDeliveries(second.address)];
  assert.equal(l1.length, 1, l1.join('\n'));
  assert.equal(l2.length, 1, l2.join('\n'));
  const qid = (line: string) => /: (\w+): to=/.exec(line)?.[1];
  assert.notEqual(qid(l1[0] as string), qid(l2[0] as string), 'two transactions, two queue ids');
  // Postfix's SMTP client orders the recipients itself: whichever went second got the 452 and was
  // deferred, then sent on the next queue run. Exactly one of them, and not recorded as a rejection.
  const log = await sender.instance.maillog();
  const deferred = [first, second].filter((inbox) =>
    new RegExp(
      `to=<${inbox.address}>.*status=deferred .*said: 452 4\\.5\\.3 <${inbox.address}>: ${SEPARATE} \\(in reply to RCPT TO command\\)`,
    ).test(log),
  );
  assert.equal(deferred.length, 1, log);
  assert.deepEqual((await poll(first)).rejections, []);
});

test('recipients that agreed at RCPT and diverge before end of data (an allowlist changed meanwhile) get 451 4.5.3, nothing kept', async () => {
  const first = await s.provision();
  const second = await s.provision();
  const { client } = await SmtpClient.open(s.smtpPort, { localAddress: '127.0.0.3' });
  try {
    assert.equal((await client.command('EHLO mail.sender.test')).code, 250);
    assert.equal((await client.command('MAIL FROM:<bounces@allowed.test>')).code, 250);
    // Both take mail from anyone: one group at RCPT.
    assert.equal((await client.command(`RCPT TO:<${first.address}>`)).code, 250);
    assert.equal((await client.command(`RCPT TO:<${second.address}>`)).code, 250);
    const put = await s.api.put(`/v1/inboxes/${second.inbox_id}/sender-domains`, {
      token: second.credentials.owner,
      body: { sender_domains: ['other.test'] },
    });
    assert.equal(put.status, 200, put.text);
    // Authenticated allowed.test mail: the first inbox would take it, the second no longer would.
    const { end } = await client.data(plainMessage({ to: first.address, from: 'alice@allowed.test' }));
    assert.equal(end?.text, '451 4.5.3 svc.test: recipients need separate transactions, try again');
  } finally {
    await client.quit();
  }
  for (const inbox of [first, second]) {
    const status = await s.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.owner });
    assert.deepEqual(
      [status.json.message_count, status.json.quota_used_bytes, status.json.rejection_count],
      [0, 0, 0],
      inbox.inbox_id,
    );
  }
});
