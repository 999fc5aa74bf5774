/**
 * The milter's reservation (reserve_messages) reads usage by the same rule as status (counts_in_usage):
 * a downloaded message stops counting once its grace window ends, for both. A reservation in several
 * inboxes is all or nothing, and a queue id already reserved in an inbox counts as reserved there.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { newMessageId } from '../../src/core/ids.ts';
import type { Reservation } from '../../src/core/ports.ts';
import { type Harness, startHarness } from '../support/harness.ts';

let h: Harness;
before(async () => {
  h = await startHarness({ QUOTA_BYTES: '1000' });
});
after(() => h.close());

const reservation = (inboxId: string, queueId: string, sizeBytes: number): Reservation => ({
  inboxId,
  messageId: newMessageId(),
  queueId,
  sizeBytes,
  envelopeFrom: 'sender@example.com',
  now: h.clock.now(),
});

async function used(inboxId: string, reader: string): Promise<number> {
  const response = await h.api.get(`/v1/inboxes/${inboxId}`, { token: reader });
  return response.json.quota_used_bytes as number;
}

test('a downloaded message frees its quota for a reservation when status stops counting it', async () => {
  const inbox = await h.provision();
  const id = await h.deliver(inbox.inbox_id, Buffer.alloc(600, 'a'));
  assert.equal(await h.messages.reserve(reservation(inbox.inbox_id, 'USAGE1', 500)), 'over_quota');
  const download = await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages/${id}`, {
    token: inbox.credentials.reader,
  });
  assert.equal(download.status, 200, download.text);
  assert.equal(await h.messages.reserve(reservation(inbox.inbox_id, 'USAGE2', 500)), 'over_quota');
  assert.equal(await used(inbox.inbox_id, inbox.credentials.reader), 600);

  h.clock.advance(h.config.downloadGraceSeconds);
  assert.equal(await used(inbox.inbox_id, inbox.credentials.reader), 0);
  assert.equal(await h.messages.reserve(reservation(inbox.inbox_id, 'USAGE3', 500)), 'reserved');
  assert.equal(await used(inbox.inbox_id, inbox.credentials.reader), 500);
});

test('one full inbox makes a multi-inbox reservation reserve nowhere; a repeated queue id is reserved already', async () => {
  const roomy = await h.provision();
  const full = await h.provision();
  await h.deliver(full.inbox_id, Buffer.alloc(900, 'f'));
  const outcome = await h.messages.reserveAll([
    reservation(roomy.inbox_id, 'MULTI1', 300),
    reservation(full.inbox_id, 'MULTI1', 300),
  ]);
  assert.deepEqual(outcome, { kind: 'over_quota', inboxIds: [full.inbox_id] });
  assert.equal(
    await used(roomy.inbox_id, roomy.credentials.reader),
    0,
    'nothing reserved in the roomy inbox',
  );

  assert.deepEqual(await h.messages.reserveAll([reservation(roomy.inbox_id, 'MULTI2', 300)]), {
    kind: 'reserved',
  });
  assert.equal(await h.messages.reserve(reservation(roomy.inbox_id, 'MULTI2', 300)), 'exists');
  assert.equal(await used(roomy.inbox_id, roomy.credentials.reader), 300, 'reserved once');
});
