/**
 * A plain message sent by SMTP through the real Postfix reaches the inbox: poll lists it with every
 * summary field right, and the download is the message as sent, below the two fields the receiving
 * side adds (our Authentication-Results on top, then Postfix's Received).
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { TOKENS } from '../../src/container.ts';
import type { ReservationLedger } from '../../src/core/reservation-ledger.ts';
import type { Database } from '../../src/storage/database.ts';
import { scalar } from '../support/jobs.ts';
import { type MailStack, plainMessage, startMailStack } from '../support/mail-stack.ts';
import { queuedAs } from '../support/smtp-client.ts';

let s: MailStack;
before(async () => {
  s = await startMailStack();
});
after(() => s?.close());

test('a plain message arrives: poll lists every summary field and the download is byte-exact', async () => {
  const inbox = await s.provision();
  const message = plainMessage({
    to: inbox.address,
    from: '=?UTF-8?B?SsO8cmdlbiBTZW5kZXI=?= <jurgen@allowed.test>',
    subject: '=?UTF-8?Q?Caf=C3=A9_code?=',
    messageId: '<plain-1@allowed.test>',
  });
  // The clock moves only by hand: received (the store) and first listed (the poll) happen at `sent`.
  s.clock.advance(7);
  const sent = s.clock.now().getTime();
  const replies = await s.send({ from: 'bounces@allowed.test', to: [inbox.address], message });
  assert.equal(replies.greeting.code, 220);
  assert.equal(replies.rcpt[0]?.code, 250);
  assert.match(replies.end?.text ?? '', /^250 2\.0\.0 Ok: queued as \w+$/);

  const token = inbox.credentials.owner;
  const poll = await s.waitFor('the message in poll', async () => {
    const r = await s.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, { token });
    return r.json.messages.length > 0 ? r.json : undefined;
  });
  const [m] = poll.messages;
  assert.match(m.message_id, /^msg_[0-9a-z]+$/);
  assert.equal(m.url, `${s.config.publicBaseUrl}/v1/inboxes/${inbox.inbox_id}/messages/${m.message_id}`);
  assert.equal(Date.parse(m.received_at), sent);
  // Listed, never downloaded: deleted UNCLAIMED_SECONDS after its first listing.
  assert.equal(Date.parse(m.delete_after), sent + s.config.unclaimedSeconds * 1000);
  assert.deepEqual(m.from, { name: 'Jürgen Sender', address: 'jurgen@allowed.test' });
  assert.equal(m.envelope_from, 'bounces@allowed.test');
  assert.equal(m.subject, 'Café code');
  assert.equal(m.internet_message_id, '<plain-1@allowed.test>');
  assert.equal(m.downloaded_at, null);
  assert.deepEqual(m.authentication, {
    dmarc: { result: 'pass', domain: 'allowed.test' },
    dkim: { result: 'none', domain: null },
    spf: { result: 'pass', domain: 'allowed.test' },
  });

  const download = await s.api.get(m.url, { token });
  assert.equal(download.status, 200);
  assert.equal(m.size_bytes, download.bytes.length);
  const text = download.bytes.toString('latin1');
  assert.match(text, /^Authentication-Results: mx\.svc\.test;\r\n/);
  const received = text.indexOf('\r\nReceived: from mail.sender.test (mail.sender.test [127.0.0.3])');
  assert.ok(received > 0, text.slice(0, 600));
  assert.ok(
    download.bytes.subarray(download.bytes.length - message.length).equals(message),
    'the message as sent ends the download',
  );
});

test('senders Postfix accepts but a strict parser would not (quoted local parts, dots, an underscore) arrive, none bounced', async () => {
  const inbox = await s.provision();
  // What the client writes in MAIL FROM.
  // From: is lax.test (DMARC p=none), so the unaligned envelope domains are not refused for DMARC.
  const senders = [
    '"john doe"@allowed.test',
    'john..doe@allowed.test',
    'a_b@sub_dom.lax.test',
    '"a@b"@allowed.test',
  ];
  const queueIds: string[] = [];
  for (const [index, from] of senders.entries()) {
    const message = plainMessage({
      from: 'sender@lax.test',
      to: inbox.address,
      subject: `odd sender ${index}`,
    });
    const replies = await s.send({ from, to: [inbox.address], message });
    const queued = queuedAs(replies);
    assert.ok(queued, `${from}: ${replies.end?.text}`);
    queueIds.push(queued);
  }
  const token = inbox.credentials.owner;
  const messages = await s.waitFor('every message in poll', async () => {
    const r = await s.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, { token });
    return r.json.messages.length === senders.length ? r.json.messages : undefined;
  });
  const bySubject = new Map(
    (messages as { subject: string; envelope_from: string }[]).map((m) => [m.subject, m.envelope_from]),
  );
  // As Postfix writes them on to the receiver: a local part that is not a dot-string is quoted.
  assert.deepEqual(
    senders.map((_, index) => bySubject.get(`odd sender ${index}`)),
    ['"john doe"@allowed.test', '"john..doe"@allowed.test', 'a_b@sub_dom.lax.test', '"a@b"@allowed.test'],
  );
  const log = await s.postfix.maillog();
  for (const queueId of queueIds) {
    assert.match(log, new RegExp(`${queueId}: to=<${inbox.address}>.* status=sent \\(250 2\\.0\\.0 msg_`));
    assert.doesNotMatch(log, new RegExp(`${queueId}: .*status=bounced`));
  }
});

test('the milter daemon names its reservations and tells its ledger of every answer: stopped, it leaves no heartbeat row', async () => {
  const ledger = s.container.resolve<ReservationLedger>(TOKENS.ReservationLedger);
  const heartbeats = () =>
    scalar(s, 'SELECT count(*) FROM milter_incarnations WHERE incarnation_id = $1', [ledger.incarnation]);
  await s.waitFor('the heartbeat row', async () => ((await heartbeats()) === 1 ? true : undefined));
  const inbox = await s.provision();
  const replies = await s.send({ to: [inbox.address], message: plainMessage({ to: inbox.address }) });
  const queueId = queuedAs(replies);
  assert.ok(queueId, JSON.stringify(replies.data));
  await s.waitFor('the delivery', async () =>
    (await s.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, { token: inbox.credentials.reader })).json
      .messages.length === 1
      ? true
      : undefined,
  );
  const [owner] = (
    await s.container
      .resolve<Database>(TOKENS.Database)
      .pool.query<{ owner: string }>('SELECT reserved_by::text AS owner FROM messages WHERE queue_id = $1', [
        queueId,
      ])
  ).rows;
  assert.equal(owner?.owner, ledger.incarnation, 'the reservation names this milter');
  assert.equal(ledger.openCount, 0, 'the answer Postfix got closed its decision');
  await s.stopDaemon('milter');
  try {
    assert.equal(await heartbeats(), 0, 'everything answered: nothing left to sweep');
  } finally {
    await s.startDaemon('milter');
  }
  await s.waitFor('the heartbeat row again', async () => ((await heartbeats()) === 1 ? true : undefined));
});
