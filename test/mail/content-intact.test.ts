/**
 * What Postfix would change on the way, by default, it does not: the download is the message as sent,
 * below our Authentication-Results and Postfix's Received (postfix/README.md, "The message as sent").
 * The client is 127.0.0.1, Postfix's own interface, where by default Postfix rewrites address headers
 * and adds missing ones (local_header_rewrite_clients); REQUIRE_PTR is off, since the test zone has no
 * PTR record for it. A header field Postfix would cut short is refused instead.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import type { ProvisionedInbox } from '../../src/core/inbox-service.ts';
import { HEADER_FIELD_TOO_LARGE, MAX_FIELD_BYTES } from '../../src/milter/session.ts';
import { type MailStack, startMailStack } from '../support/mail-stack.ts';

let s: MailStack;
before(async () => {
  s = await startMailStack({ env: { REQUIRE_PTR: 'false' } });
});
after(() => s?.close());

/** `Name:` and a value folded into 70-byte lines, `bytes` long as Postfix holds it (lines joined by LF). */
function foldedField(name: string, bytes: number, lineBytes = 70): string {
  const room = bytes - name.length - 1;
  const step = lineBytes + 1;
  const lines = Array.from({ length: Math.floor(room / step) - 1 }, () => ` ${'h'.repeat(lineBytes - 1)}`);
  const last = ` ${'h'.repeat(room - lines.length * step - 1)}`;
  return `${name}:${[...lines, last].join('\r\n')}`;
}

async function onlyMessage(inboxId: string, token: string) {
  return s.waitFor('the message in poll', async () => {
    const r = await s.api.get(`/v1/inboxes/${inboxId}/messages`, { token });
    return r.json.messages.length > 0 ? r.json.messages[0] : undefined;
  });
}

/** Sends `message` to the inbox and checks the download ends with it byte for byte (below our headers). */
async function assertStoredAsSent(inbox: ProvisionedInbox, message: Buffer): Promise<void> {
  const replies = await s.send({ from: 'sender@allowed.test', to: [inbox.address], message });
  assert.match(replies.end?.text ?? '', /^250 2\.0\.0 Ok: queued as \w+$/);
  const token = inbox.credentials.reader;
  const m = await onlyMessage(inbox.inbox_id, token);
  const download = await s.api.get(m.url, { token });
  assert.equal(download.status, 200);
  assert.equal(m.size_bytes, download.bytes.length);
  assert.deepEqual(download.bytes.subarray(download.bytes.length - message.length), message);
}

test('from a client on Postfix own interface, nothing is rewritten, added, broken or converted', async () => {
  const inbox = await s.provision();
  const addresses = Array.from({ length: 2000 }, (_, i) => `user${i}@example.test`);
  const field = foldedField('X-Folded', MAX_FIELD_BYTES);
  assert.equal(field.replaceAll('\r\n', '\n').length, MAX_FIELD_BYTES);
  const message = Buffer.from(
    [
      // No Message-ID and no Date: Postfix adds them for such clients by default.
      'From: Sender <sender@allowed.test>',
      // Unqualified and packed addresses: Postfix's rewriting qualifies them and re-folds the field.
      `To: team,${inbox.address},b@example.test`,
      // 2,000 addresses (about 48 KB, 12,000 tokens): rewriting keeps 10,240 address tokens.
      `Cc: ${addresses.join(',\r\n ')}`,
      field,
      `X-Long: ${'a'.repeat(5000)}`,
      'Subject: intact',
      'MIME-Version: 1.0',
      'Content-Type: text/plain; charset=utf-8',
      'Content-Transfer-Encoding: 8bit',
      '',
      'Grüße, 8-bit text that Postfix could turn into quoted-printable.',
      // Postfix's LMTP client breaks lines over 998 bytes by default.
      'b'.repeat(3000),
      '',
    ].join('\r\n'),
  );
  const replies = await s.send({
    from: 'sender@allowed.test',
    to: [inbox.address],
    message,
    localAddress: '127.0.0.1',
  });
  assert.match(replies.end?.text ?? '', /^250 2\.0\.0 Ok: queued as \w+$/);

  const token = inbox.credentials.reader;
  const m = await onlyMessage(inbox.inbox_id, token);
  assert.equal(m.internet_message_id, null);
  const download = await s.api.get(m.url, { token });
  assert.equal(download.status, 200);
  const text = download.bytes.toString('latin1');
  const start = text.indexOf('\r\nFrom: Sender <sender@allowed.test>\r\n') + 2;
  assert.ok(start > 2, text.slice(0, 600));
  assert.match(text.slice(0, start), /^Authentication-Results: mx\.svc\.test;\r\n[\s\S]*\r\nReceived: from /);
  assert.doesNotMatch(text.slice(0, start), /^(Message-I[Dd]|Date|To|Cc):/m);
  assert.equal(download.bytes.length - start, message.length);
  assert.ok(
    download.bytes.subarray(start).equals(message),
    'the message as sent follows the two added fields',
  );
  assert.doesNotMatch(await s.postfix.maillog(), /breaking line/);
});

test('header fields Postfix deletes by default, and a MIME part header it would cut, arrive as sent', async () => {
  const inbox = await s.provision();
  const boundary = 'b0undary';
  // A part header field of 110,000 bytes: with MIME parsing on, cleanup cut it at 60,000, silently
  // (the milter sees only the message header).
  const partField = foldedField('X-Part-Big', 110_000);
  const message = Buffer.from(
    [
      'From: Sender <sender@allowed.test>',
      `To: ${inbox.address}`,
      // message_drop_headers deleted these four by default.
      'Return-Path: <sender@allowed.test>',
      'Bcc: hidden@example.test',
      'Content-Length: 5',
      'Resent-Bcc: hidden-too@example.test',
      'Subject: kept fields',
      'MIME-Version: 1.0',
      `Content-Type: multipart/mixed; boundary="${boundary}"`,
      '',
      `--${boundary}`,
      'Content-Type: text/plain',
      partField,
      'X-After: 1',
      '',
      'part body',
      `--${boundary}--`,
      '',
    ].join('\r\n'),
  );
  await assertStoredAsSent(inbox, message);
});

test('a bare CR in a header field and in the body arrives as sent (cleanup_replace_stray_cr_lf = no)', async () => {
  // Postfix 3.7.10 and later replace each stray CR with a space by default, against outbound SMTP
  // smuggling, which a receive-only service never does; until 2026-11-25 such mail was stored changed
  // and its DKIM signature could fail on our side only (Postfix review).
  const inbox = await s.provision();
  const message = Buffer.from(
    [
      'From: Sender <sender@allowed.test>',
      `To: ${inbox.address}`,
      'Subject: a\rb',
      'MIME-Version: 1.0',
      '',
      'one\rtwo',
      'three\r',
      '',
    ].join('\r\n'),
  );
  await assertStoredAsSent(inbox, message);
});

test('a header field Postfix cuts (over 60,000 bytes, with a milter) is 552 5.3.4 at end of data, and nothing is kept', async () => {
  const inbox = await s.provision();
  // Postfix keeps 54,000 to 60,000 bytes of such a field: in 70-byte lines about 59,990, in 5,000-byte
  // lines 55,010 (it drops the line crossing 60,000 when that line starts past 54,000).
  for (const field of [foldedField('X-Folded', 61_000), foldedField('X-Folded', 60_500, 5000)]) {
    assert.equal(field.replaceAll('\r\n', '\n').length > 60_000, true);
    const message = Buffer.from(
      [
        'From: Sender <sender@allowed.test>',
        `To: ${inbox.address}`,
        field,
        'Subject: cut',
        '',
        'body',
        '',
      ].join('\r\n'),
    );
    const refused = await s.send({ from: 'sender@allowed.test', to: [inbox.address], message });
    assert.equal(refused.data?.code, 354);
    assert.equal(refused.end?.text, `552 5.3.4 ${HEADER_FIELD_TOO_LARGE.text}`);
  }
  const st = await s.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.owner });
  assert.deepEqual([st.json.message_count, st.json.quota_used_bytes, st.json.rejection_count], [0, 0, 0]);
});
