/**
 * Quota and size over real SMTP through the real Postfix (contract section 4 "Receiving mail" and
 * section 8; DESIGN decisions 2 and 4).
 *
 * Quota: a message larger than the free quota is refused at end of data with the milter's literal
 * `555 5.7.1 svc.test: mailbox quota exceeded` and a `quota` event; a declared SIZE= over it is refused
 * at RCPT; mail in flight (reserved by the milter, not yet stored over LMTP) counts; concurrent
 * deliveries never overfill an inbox. The milter reserves size-as-sent + our Authentication-Results +
 * receivedAllowance() (which grows with the client's HELO); the stored message then counts its real size. Sizes below keep margins of
 * several KB either side of every boundary.
 *
 * Size: a single message is at most 25 MiB (26214400 bytes) counted as the sender sends it; exactly
 * that passes and downloads byte-exact, one byte more is `552 5.3.4` at end of data and nothing is kept.
 */
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { after, before, describe, test } from 'node:test';
import type { ProvisionedInbox } from '../../src/core/inbox-service.ts';
import { MAX_ADDED_BYTES, receivedAllowance } from '../../src/core/message-admission.ts';
import { HEADERS_TOO_LARGE } from '../../src/milter/session.ts';
import { MAIL_DOMAIN, type MailStack, startMailStack } from '../support/mail-stack.ts';
import { queuedAs } from '../support/smtp-client.ts';

const QUOTA_BYTES = 200_000;
const QUOTA_EXCEEDED = `555 5.7.1 ${MAIL_DOMAIN}: mailbox quota exceeded`;
const TOO_BIG = '552 5.3.4 Message size exceeds fixed maximum message size';
const MAX_MESSAGE_BYTES = 26_214_400;

let serial = 0;

/** How the test client appears in Postfix's Received field (dns-zone.ts names 127.0.0.3). */
const TEST_CLIENT = { helo: 'mail.sender.test', clientName: 'mail.sender.test', clientAddress: '127.0.0.3' };

/**
 * A message of exactly `size` bytes as sent (header, blank line, body), CRLF line ends, body lines of
 * 76 ASCII characters (none starts with a dot) and a last line of 1 to 78. The last line is never empty,
 * whatever the header's length (the Message-ID holds the pid): the 25 MiB test removes its third-last
 * byte, which must be a character, not the LF of a CRLF (that left a bare CR, which Postfix rewrites).
 */
function messageOfSize(to: string, size: number, subject = `sized ${size}`): Buffer {
  const id = `<q${process.pid}.${++serial}@allowed.test>`;
  const head = Buffer.from(
    [
      'From: Sender <sender@allowed.test>',
      `To: ${to}`,
      `Subject: ${subject}`,
      `Message-ID: ${id}`,
      'Date: Sat, 21 Nov 2026 12:00:00 +0000',
      'MIME-Version: 1.0',
      'Content-Type: text/plain; charset=us-ascii',
      '',
      '',
    ].join('\r\n'),
  );
  const n = size - head.length;
  assert.ok(n >= 2, 'size too small for the header');
  const message = Buffer.alloc(size, 'abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ ');
  head.copy(message);
  const body = message.subarray(head.length);
  for (let end = 76; end + 2 < n - 2; end += 78) body.write('\r\n', end, 'latin1');
  body.write('\r\n', n - 2, 'latin1');
  return message;
}

/** CRs not followed by LF plus LFs not preceded by CR. */
function bareLineBreaks(message: Buffer): number {
  let bare = 0;
  for (let i = message.indexOf(0x0d); i !== -1; i = message.indexOf(0x0d, i + 1))
    bare += message[i + 1] === 0x0a ? 0 : 1;
  for (let i = message.indexOf(0x0a); i !== -1; i = message.indexOf(0x0a, i + 1))
    bare += message[i - 1] === 0x0d ? 0 : 1;
  return bare;
}

const sha256 = (bytes: Buffer) => createHash('sha256').update(bytes).digest('hex');

function helpers(stack: () => MailStack) {
  const status = async (inbox: ProvisionedInbox) => {
    const r = await stack().api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.owner });
    assert.equal(r.status, 200, r.text);
    return r.json;
  };
  const poll = async (inbox: ProvisionedInbox) => {
    const r = await stack().api.get(`/v1/inboxes/${inbox.inbox_id}/messages?limit=200`, {
      token: inbox.credentials.owner,
    });
    assert.equal(r.status, 200, r.text);
    return r.json;
  };
  /** Waits until poll lists `count` messages and returns that poll response. */
  const listed = (inbox: ProvisionedInbox, count: number) =>
    stack().waitFor(`${count} message(s) listed`, async () => {
      const p = await poll(inbox);
      return p.messages.length >= count ? p : undefined;
    });
  return { status, poll, listed };
}

describe('quota', () => {
  let s: MailStack;
  const { status, poll, listed } = helpers(() => s);
  before(async () => {
    s = await startMailStack({ env: { QUOTA_BYTES: String(QUOTA_BYTES), POLL_RATE_BURST: '100000' } });
  });
  after(() => s?.close());

  test('a message larger than the free quota is refused with 555 5.7.1 svc.test: mailbox quota exceeded and a quota event; a smaller one still fits', async () => {
    const inbox = await s.provision();
    assert.equal((await status(inbox)).quota_bytes, QUOTA_BYTES);

    const first = messageOfSize(inbox.address, 150_000);
    assert.equal((await s.send({ to: [inbox.address], message: first })).end?.code, 250);
    const [stored] = (await listed(inbox, 1)).messages;
    // Free now: 200000 - (150000 + our A-R + Received) ≈ 49.4 KB.
    const free = QUOTA_BYTES - stored.size_bytes;
    assert.ok(free > 45_000 && free < 50_000, `free ${free}`);

    const tooBig = messageOfSize(inbox.address, 60_000);
    const refused = await s.send({ from: 'bulk@allowed.test', to: [inbox.address], message: tooBig });
    assert.equal(refused.rcpt[0]?.code, 250, 'nothing declared: RCPT passes, the milter decides');
    assert.equal(refused.end?.text, QUOTA_EXCEEDED);

    const fits = messageOfSize(inbox.address, 40_000);
    assert.equal((await s.send({ to: [inbox.address], message: fits })).end?.code, 250);
    const after = await listed(inbox, 2);
    assert.equal(after.messages.length, 2);
    assert.deepEqual(
      after.rejections.map((e: Record<string, unknown>) => ({ ...e, at: typeof e.at })),
      [
        {
          at: 'string',
          envelope_from: 'bulk@allowed.test',
          reason: 'quota',
          sender_domain: 'allowed.test',
          size_bytes: tooBig.length,
        },
      ],
    );
    const st = await status(inbox);
    assert.equal(st.rejection_count, 1);
    assert.equal(st.message_count, 2);
    assert.equal(
      st.quota_used_bytes,
      after.messages.reduce((sum: number, m: { size_bytes: number }) => sum + m.size_bytes, 0),
    );
    assert.ok(st.quota_used_bytes <= QUOTA_BYTES);
  });

  test('a downloaded message stops counting when it is deleted 5 minutes later: the refused message, resent then, is accepted', async () => {
    const inbox = await s.provision();
    const first = messageOfSize(inbox.address, 150_000);
    assert.equal((await s.send({ to: [inbox.address], message: first })).end?.code, 250);
    const [stored] = (await listed(inbox, 1)).messages;
    const later = messageOfSize(inbox.address, 60_000);
    assert.equal((await s.send({ to: [inbox.address], message: later })).end?.text, QUOTA_EXCEEDED);

    const download = await s.api.get(stored.url, { token: inbox.credentials.reader });
    assert.equal(download.status, 200);
    s.clock.advance(299);
    assert.equal((await s.send({ to: [inbox.address], message: later })).end?.text, QUOTA_EXCEEDED);
    s.clock.advance(1);
    assert.equal((await status(inbox)).quota_used_bytes, 0);
    assert.equal((await s.send({ to: [inbox.address], message: later })).end?.code, 250);
    const after = await listed(inbox, 1);
    assert.equal(after.messages.length, 1);
    assert.equal(after.messages[0].size_bytes > 60_000, true);
    assert.equal((await status(inbox)).rejection_count, 2);
  });

  test('a declared SIZE= larger than the free quota is refused at RCPT with the quota reason and recorded', async () => {
    const inbox = await s.provision();
    const message = messageOfSize(inbox.address, 1_000);
    const r = await s.send({ to: [inbox.address], message, mailParams: `SIZE=${QUOTA_BYTES + 1}` });
    assert.equal(r.mail?.code, 250);
    assert.equal(
      r.rcpt[0]?.text,
      `555 5.7.1 <${inbox.address}>: Recipient address rejected: ${MAIL_DOMAIN}: mailbox quota exceeded`,
    );
    assert.equal(r.end, undefined);
    const p = await poll(inbox);
    assert.equal(p.messages.length, 0);
    assert.deepEqual(
      p.rejections.map((e: { reason: string; size_bytes: number }) => [e.reason, e.size_bytes]),
      [['quota', QUOTA_BYTES + 1]],
    );
  });

  test('mail in flight counts: a reservation waiting for LMTP shows in quota_used_bytes and message_count and keeps out a message that would not fit beside it', async () => {
    const inbox = await s.provision();
    const first = messageOfSize(inbox.address, 120_000);
    const second = messageOfSize(inbox.address, 90_000); // alone it fits; beside the first it does not
    await s.stopDaemon('lmtp');
    let queueId: string | undefined;
    try {
      const r = await s.send({ to: [inbox.address], message: first });
      queueId = queuedAs(r);
      assert.ok(queueId, r.end?.text);

      // Postfix holds it: the receiver is down.
      const entry = await s.waitFor('the message deferred in the queue', async () => {
        const q = await s.postfix.queue();
        return q.find((e) => e.queueId === queueId && e.recipients[0]?.delayReason);
      });
      assert.equal(entry.recipients[0]?.address, inbox.address);

      const inFlight = await status(inbox);
      assert.equal(inFlight.message_count, 1);
      const allowance = receivedAllowance(TEST_CLIENT, [inbox.address]);
      assert.ok(
        inFlight.quota_used_bytes >= first.length + allowance &&
          inFlight.quota_used_bytes < first.length + allowance + 2_000,
        `reserved ${inFlight.quota_used_bytes}`,
      );
      assert.equal((await poll(inbox)).messages.length, 0, 'poll lists only stored mail');

      const refused = await s.send({ to: [inbox.address], message: second });
      assert.equal(refused.end?.text, QUOTA_EXCEEDED);
      const afterRefusal = await status(inbox);
      assert.equal(afterRefusal.message_count, 1);
      assert.equal(afterRefusal.quota_used_bytes, inFlight.quota_used_bytes);
      assert.equal(afterRefusal.rejection_count, 1);

      await s.startDaemon('lmtp');
      await s.postfix.flush();
      const [m] = (await listed(inbox, 1)).messages;
      const download = await s.api.get(m.url, { token: inbox.credentials.reader });
      assert.equal(download.status, 200);
      assert.ok(
        download.bytes.subarray(-first.length).equals(first),
        'the download ends with the message sent',
      );

      // The reservation was exactly: sent + our Authentication-Results field + the Received allowance.
      const text = download.bytes.toString('latin1');
      const received = text.indexOf('\r\nReceived: ');
      assert.ok(text.startsWith('Authentication-Results: ') && received > 0, text.slice(0, 400));
      const authResultsField = received + 2;
      assert.equal(inFlight.quota_used_bytes, first.length + authResultsField + allowance);

      // Once stored it counts its real size.
      const storedStatus = await status(inbox);
      assert.equal(storedStatus.message_count, 1);
      assert.equal(storedStatus.quota_used_bytes, m.size_bytes);
      assert.equal(m.size_bytes, download.bytes.length);
      assert.ok(m.size_bytes < inFlight.quota_used_bytes);
      await s.waitFor('an empty queue', async () => ((await s.postfix.queueEmpty()) ? true : undefined));
    } finally {
      await s.startDaemon('lmtp').catch(() => undefined);
    }
  });

  test("a client's long HELO name, repeated in Postfix's Received field, is reserved for: the stored message never outgrows its reservation", async () => {
    // With a fixed 2 KiB for the Received field, a 2,000-byte HELO made the stored copy larger than
    // what was reserved, and an inbox filled to its last byte went over its quota (a review found it).
    const inbox = await s.provision();
    const helo = `${'h'.repeat(1990)}.sender.test`;
    await s.stopDaemon('lmtp');
    let reserved = 0;
    try {
      const r = await s.send({ to: [inbox.address], message: messageOfSize(inbox.address, 20_000), helo });
      assert.ok(queuedAs(r), r.end?.text);
      reserved = (await status(inbox)).quota_used_bytes;
    } finally {
      await s.startDaemon('lmtp');
    }
    await s.postfix.flush();
    const [m] = (await listed(inbox, 1)).messages;
    const text = (await s.api.get(m.url, { token: inbox.credentials.reader })).bytes.toString('latin1');
    assert.ok(text.includes(`Received: from ${helo} (`), 'the HELO is in the Received field');
    assert.ok(m.size_bytes <= reserved, `stored ${m.size_bytes} > reserved ${reserved}`);
  });

  test('ten concurrent deliveries to an inbox with room for five: five accepted, five get the quota reply, the inbox never holds more than its quota', async () => {
    const inbox = await s.provision();
    const SIZE = 35_000;
    // Reserved each: 35000 + A-R (< 1000) + 2048 < 38.1 KB, so five reservations (< 190.5 KB) always
    // fit; stored each: > 35 KB, so six never fit in 200 KB, reserved or stored.
    const fitting = Math.floor(QUOTA_BYTES / SIZE);
    assert.equal(fitting, 5);
    const messages = Array.from({ length: 10 }, (_, i) => messageOfSize(inbox.address, SIZE, `race ${i}`));
    const replies = await Promise.all(messages.map((message) => s.send({ to: [inbox.address], message })));

    const ends = replies.map((r) => r.end?.text ?? `(no end of data: ${JSON.stringify(r.rcpt)})`);
    const accepted = replies.filter((r) => r.end?.code === 250);
    const refused = ends.filter((t) => t === QUOTA_EXCEEDED);
    assert.equal(accepted.length + refused.length, 10, ends.join('\n'));
    assert.equal(accepted.length, fitting, ends.join('\n'));

    const p = await listed(inbox, fitting);
    await s.waitFor('an empty queue', async () => ((await s.postfix.queueEmpty()) ? true : undefined));
    const final = await poll(inbox);
    assert.equal(final.messages.length, fitting);
    const storedTotal = final.messages.reduce(
      (sum: number, m: { size_bytes: number }) => sum + m.size_bytes,
      0,
    );
    assert.ok(storedTotal <= QUOTA_BYTES, `stored ${storedTotal}`);
    assert.equal(final.inbox.quota_used_bytes, storedTotal);
    assert.equal(final.inbox.message_count, fitting);
    assert.equal(final.inbox.rejection_count, 10 - fitting);
    assert.equal(p.rejections.length, 10 - fitting);
    assert.ok(
      p.rejections.every(
        (e: { reason: string; size_bytes: number }) => e.reason === 'quota' && e.size_bytes === SIZE,
      ),
    );
  });
});

describe('grouping several recipients (DESIGN decision 3) at the quota boundary', () => {
  // MAX_MESSAGE_BYTES small so the boundary is cheap to reach; the quota leaves a fresh inbox room for
  // a message of the largest size plus MAX_ADDED_BYTES.
  const MAX = 20_000;
  const QUOTA = 100_000;
  let s: MailStack;
  const { status, poll, listed } = helpers(() => s);
  before(async () => {
    s = await startMailStack({
      env: { MAX_MESSAGE_BYTES: String(MAX), QUOTA_BYTES: String(QUOTA), POLL_RATE_BURST: '100000' },
    });
  });
  after(() => s?.close());

  test('an inbox with room for the largest message but not for its reservation is not grouped: the other recipient gets 452 4.5.3, not a 451 on every retry', async () => {
    const tight = await s.provision();
    const roomy = await s.provision();
    assert.ok(QUOTA >= MAX + MAX_ADDED_BYTES, 'the roomy inbox can take any message with its reservation');
    // Fill `tight` until its free quota is MAX + 600: room for a MAX-byte message as sent, none for what
    // the milter reserves beyond it (our field and the Received allowance, well over 600 bytes).
    for (let i = 1; i <= 4; i++) {
      assert.equal(
        (await s.send({ to: [tight.address], message: messageOfSize(tight.address, 19_000) })).end?.code,
        250,
      );
      await listed(tight, i);
    }
    const [first] = (await poll(tight)).messages;
    const overhead = first.size_bytes - 19_000;
    const filler = QUOTA - (await status(tight)).quota_used_bytes - (MAX + 600) - overhead;
    assert.equal(
      (await s.send({ to: [tight.address], message: messageOfSize(tight.address, filler) })).end?.code,
      250,
    );
    await listed(tight, 5);
    assert.equal(QUOTA - (await status(tight)).quota_used_bytes, MAX + 600);

    const message = messageOfSize(tight.address, MAX, 'largest');
    const together = await s.send({ to: [tight.address, roomy.address], message });
    assert.deepEqual(
      together.rcpt.map((r) => r.text),
      [
        '250 2.1.5 Ok',
        `452 4.5.3 <${roomy.address}>: Recipient address rejected: ${MAIL_DOMAIN}: send this recipient in a separate transaction`,
      ],
    );
    // The tight inbox alone: its reservation does not fit, a quota refusal, recorded.
    assert.equal(together.end?.text, QUOTA_EXCEEDED);
    const tightPoll = await poll(tight);
    assert.deepEqual(
      tightPoll.rejections.map((e: { reason: string; size_bytes: number }) => [e.reason, e.size_bytes]),
      [['quota', MAX]],
    );
    // The roomy one, in its own transaction, gets the message.
    assert.equal((await s.send({ to: [roomy.address], message })).end?.code, 250);
    const [stored] = (await listed(roomy, 1)).messages;
    assert.equal(stored.subject, 'largest');
  });
});

describe('size', () => {
  let s: MailStack;
  const { status, poll, listed } = helpers(() => s);
  before(async () => {
    s = await startMailStack({ env: { POLL_RATE_BURST: '100000' } });
  });
  after(() => s?.close());

  test('a message of exactly 25 MiB as sent is accepted and downloads ending with the exact bytes; one byte more is 552 5.3.4 at end of data and nothing is kept', async () => {
    const inbox = await s.provision();
    const over = messageOfSize(inbox.address, MAX_MESSAGE_BYTES + 1, 'twenty-five MiB');
    // The same message with the last body line one character shorter.
    const exact = Buffer.concat([over.subarray(0, over.length - 3), over.subarray(over.length - 2)]);
    assert.equal(exact.length, MAX_MESSAGE_BYTES);
    assert.equal(over.length, MAX_MESSAGE_BYTES + 1);
    assert.equal(bareLineBreaks(exact), 0, 'the exact message has only CRLF line ends');

    const refused = await s.send({ to: [inbox.address], message: over });
    assert.equal(refused.rcpt[0]?.code, 250);
    assert.equal(refused.data?.code, 354);
    assert.equal(refused.end?.text, TOO_BIG);
    const afterRefusal = await status(inbox);
    assert.equal(afterRefusal.message_count, 0);
    assert.equal(afterRefusal.quota_used_bytes, 0);
    assert.equal(afterRefusal.rejection_count, 0, 'a size refusal is not recorded');

    const accepted = await s.send({ to: [inbox.address], message: exact });
    assert.match(accepted.end?.text ?? '', /^250 2\.0\.0 Ok: queued as \w+$/);
    const [m] = (await listed(inbox, 1)).messages;
    const download = await s.api.get(m.url, { token: inbox.credentials.reader });
    assert.equal(download.status, 200);
    assert.equal(m.size_bytes, download.bytes.length);
    assert.equal(sha256(download.bytes.subarray(download.bytes.length - exact.length)), sha256(exact));

    await s.waitFor('an empty queue', async () => ((await s.postfix.queueEmpty()) ? true : undefined));
    const p = await poll(inbox);
    assert.equal(p.messages.length, 1);
    assert.equal(p.rejections.length, 0);
    assert.equal(p.inbox.quota_used_bytes, m.size_bytes);
  });

  test('header fields adding up to more than 1 MiB (each one small enough for Postfix) are 552 5.3.4 at end of data, for good, and nothing is kept', async () => {
    const inbox = await s.provision();
    // 25 fields of 50 KB, folded into 1,000-character lines: Postfix cuts a longer field (it kept about
    // 59 KB of each of 99 KB) and longer lines, and lets any number of fields through.
    const folded = Array.from({ length: 50 }, () => 'x'.repeat(998)).join('\r\n ');
    const fields = Array.from({ length: 25 }, (_, i) => `X-Big-${i}: ${folded}\r\n`).join('');
    const message = Buffer.from(
      `${fields}From: S <s@allowed.test>\r\nTo: ${inbox.address}\r\nSubject: big head\r\n\r\nbody\r\n`,
    );
    const refused = await s.send({ to: [inbox.address], message });
    assert.equal(refused.data?.code, 354);
    assert.equal(refused.end?.text, `552 5.3.4 ${HEADERS_TOO_LARGE.text}`);
    const st = await status(inbox);
    assert.deepEqual([st.message_count, st.quota_used_bytes, st.rejection_count], [0, 0, 0]);
  });
});
