import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { type Harness, startHarness } from '../support/harness.ts';

let h: Harness;
before(async () => {
  h = await startHarness();
});
after(() => h.close());

test('a delivered message is listed by poll and downloads byte-exact', async () => {
  const inbox = await h.provision();
  const raw = `From: A <a@example.com>\r\nSubject: hi\r\n\r\n${'x'.repeat(600_000)}\r\n`;
  const id = await h.deliver(inbox.inbox_id, raw);
  const poll = await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, { token: inbox.credentials.reader });
  assert.equal(poll.status, 200);
  assert.equal(poll.json.messages.length, 1);
  assert.equal(poll.json.messages[0].message_id, id);
  const download = await h.api.get(poll.json.messages[0].url, { token: inbox.credentials.reader });
  assert.equal(download.status, 200);
  assert.equal(download.bytes.toString(), raw);
});
