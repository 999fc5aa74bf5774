/**
 * Contract section 1: a single inbound message is at most 25 MiB. One that size, handed to storage as
 * a single piece (as a network stream may), is stored in 256 KiB chunks and downloads byte-exact.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { type Harness, startHarness } from '../support/harness.ts';

let h: Harness;
before(async () => {
  h = await startHarness();
});
after(() => h.close());

test('a 25 MiB message delivered as one piece downloads byte-exact with its ETag and size', async () => {
  const inbox = await h.provision();
  const raw = Buffer.alloc(25 * 1024 * 1024);
  for (let i = 0; i < raw.length; i += 4096) raw.writeUInt32BE(i, i);
  const started = performance.now();
  const id = await h.deliver(inbox.inbox_id, raw, { pieceBytes: raw.length });
  const storeMs = performance.now() - started;
  const response = await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages/${id}`, {
    token: inbox.credentials.reader,
  });
  assert.equal(response.status, 200);
  assert.equal(response.headers.get('content-length'), String(raw.length));
  assert.ok(response.bytes.equals(raw), 'the download differs from the message as delivered');
  assert.equal(response.headers.get('etag'), `"${id}"`);
  process.stdout.write(`# stored 25 MiB in one piece in ${storeMs.toFixed(0)} ms\n`);
});
