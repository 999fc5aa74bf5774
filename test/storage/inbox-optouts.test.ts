/**
 * The mail path reads inboxes and the sender's opt-outs in one statement (InboxStore.findForDelivery
 * and findWithOptOuts): the opt-outs come back whether or not any inbox is found, only for the names
 * asked about.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { TOKENS } from '../../src/container.ts';
import { OptOuts } from '../../src/core/opt-outs.ts';
import type { InboxStore, OptOutStore } from '../../src/core/ports.ts';
import { type Harness, startHarness } from '../support/harness.ts';

let h: Harness;
let inboxes: InboxStore;
before(async () => {
  h = await startHarness();
  inboxes = h.container.resolve<InboxStore>(TOKENS.InboxStore);
  const optOuts = h.container.resolve<OptOutStore>(TOKENS.OptOutStore);
  await optOuts.add('gone.example', h.clock.now());
  await optOuts.add('other.example', h.clock.now());
});
after(() => h.close());

test('findWithOptOuts: the inboxes that exist, and the opted-out names among those asked', async () => {
  const [a, b] = [await h.provision(), await h.provision()];
  const found = await inboxes.findWithOptOuts(
    [a.inbox_id, 'no1nbox0000000000000', b.inbox_id],
    ['mail.gone.example', 'gone.example', 'example'],
  );
  assert.deepEqual([...found.inboxes.keys()].sort(), [a.inbox_id, b.inbox_id].sort());
  assert.equal(found.inboxes.get(a.inbox_id)?.inboxId, a.inbox_id);
  assert.deepEqual(found.optedOut, ['gone.example']);
});

test('findWithOptOuts with no inbox found still reads the opt-outs; with no names, none', async () => {
  const none = await inboxes.findWithOptOuts(['no1nbox0000000000000'], ['gone.example']);
  assert.equal(none.inboxes.size, 0);
  assert.deepEqual(none.optedOut, ['gone.example']);
  const a = await h.provision();
  const plain = await inboxes.findWithOptOuts([a.inbox_id], []);
  assert.deepEqual([...plain.inboxes.keys()], [a.inbox_id]);
  assert.deepEqual(plain.optedOut, []);
});

test('findForDelivery carries the opted-out names among those asked, and none when asked none', async () => {
  const a = await h.provision();
  const asked = await inboxes.findForDelivery(a.inbox_id, h.clock.now(), [
    'x.other.example',
    'other.example',
  ]);
  assert.deepEqual(asked?.optedOut, ['other.example']);
  assert.equal(asked?.usedBytes, 0);
  const plain = await inboxes.findForDelivery(a.inbox_id, h.clock.now());
  assert.deepEqual(plain?.optedOut, []);
});

test('OptOuts.covering picks the domain itself or its closest registered parent, never a subdomain', () => {
  assert.equal(OptOuts.covering('Mail.Gone.Example', ['gone.example']), 'gone.example');
  assert.equal(OptOuts.covering('a.b.gone.example', ['gone.example', 'b.gone.example']), 'b.gone.example');
  assert.equal(OptOuts.covering('gone.example', ['sub.gone.example']), null);
  assert.equal(OptOuts.covering('gone.example', []), null);
});
