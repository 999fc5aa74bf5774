/**
 * The three daemons can listen on unix sockets (POLICY_PORT, MILTER_PORT and LMTP_PORT as absolute
 * paths), which Postfix reaches as its own unprivileged user: mail flows end to end through them.
 */
import assert from 'node:assert/strict';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { type MailStack, plainMessage, startMailStack } from '../support/mail-stack.ts';

let s: MailStack;
let dir: string;
before(async () => {
  dir = await mkdtemp(join(tmpdir(), 'inbox-sockets-'));
  await chmod(dir, 0o755);
  s = await startMailStack({
    env: {
      POLICY_PORT: join(dir, 'policy.sock'),
      MILTER_PORT: join(dir, 'milter.sock'),
      LMTP_PORT: join(dir, 'lmtp.sock'),
    },
  });
});
after(async () => {
  await s?.close();
  await rm(dir, { recursive: true, force: true });
});

test('mail is refused and delivered through policy, milter and LMTP on unix sockets', async () => {
  const inbox = await s.provision();
  const refused = await s.send({ to: [`aaaaaaaaaaaaaaaaaaaa@svc.test`], message: plainMessage({ to: 'x' }) });
  assert.equal(
    refused.rcpt[0]?.text,
    '555 5.7.1 <aaaaaaaaaaaaaaaaaaaa@svc.test>: Recipient address rejected: svc.test: no such inbox',
  );
  const replies = await s.send({ to: [inbox.address], message: plainMessage({ to: inbox.address }) });
  assert.match(replies.end?.text ?? '', /^250 2\.0\.0 Ok: queued as/);
  const listed = await s.waitFor('the message in poll', async () => {
    const r = await s.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, { token: inbox.credentials.owner });
    return r.json.messages.length > 0 ? r.json.messages : undefined;
  });
  assert.equal(listed[0].authentication.spf.result, 'pass');
  assert.match(await s.postfix.maillog(), /relay=.*lmtp\.sock.*status=sent/);
});
