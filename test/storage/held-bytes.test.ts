/**
 * inboxes.held_bytes and inbox_used_bytes (migrations/20261125000000_held_bytes.ts) against the rule
 * they stand for: after every kind of change to messages (reservations, whole and streamed deliveries,
 * duplicates, listing, download, overdue timers before and after the delete job, released
 * reservations, a lost message, rows deleted by hand, cancel, expiry in one statement over several inboxes, purge), every
 * inbox's counter equals the sum of its messages not deleted, and the usage the mail path reads equals
 * the sum counts_in_usage gives at the same instant.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { TOKENS } from '../../src/container.ts';
import { newMessageId } from '../../src/core/ids.ts';
import { EXPIRE_SETTLE_SECONDS } from '../../src/jobs/expire-inboxes.ts';
import type { Database } from '../../src/storage/database.ts';
import { USAGE_WHERE } from '../../src/storage/usage.ts';
import { type Harness, startHarness } from '../support/harness.ts';
import { deliverMany, testJobs } from '../support/jobs.ts';

let h: Harness;
before(async () => {
  h = await startHarness({
    DOWNLOAD_GRACE_SECONDS: '5',
    UNCLAIMED_SECONDS: '10',
    PURGE_AFTER_SECONDS: '20',
    RESERVATION_TTL_SECONDS: '30',
    POLL_RATE_BURST: '100000',
    DOWNLOAD_RATE_BURST: '100000',
  });
});
after(() => h.close());

interface Count {
  inbox_id: string;
  held_bytes: number;
  undeleted: number;
  used_now: number;
  rule_now: number;
}

/** Every inbox's counter, its undeleted sum, the mail path's usage and the rule's, at the clock's now. */
async function counts(): Promise<Count[]> {
  const db = h.container.resolve<Database>(TOKENS.Database);
  const { rows } = await db.pool.query<Count>(
    `SELECT i.inbox_id, i.held_bytes,
       (SELECT coalesce(sum(size_bytes), 0) FROM messages m WHERE m.inbox_id = i.inbox_id AND m.state <> 'deleted')::int8
         AS undeleted,
       inbox_used_bytes(i.inbox_id, i.held_bytes, $1) AS used_now,
       (SELECT coalesce(sum(size_bytes), 0) FROM messages WHERE ${USAGE_WHERE('i.inbox_id', '$1::timestamptz')})::int8
         AS rule_now
     FROM inboxes i ORDER BY i.inbox_id`,
    [h.clock.now()],
  );
  return rows.map((r) => ({
    ...r,
    held_bytes: Number(r.held_bytes),
    undeleted: Number(r.undeleted),
    used_now: Number(r.used_now),
    rule_now: Number(r.rule_now),
  }));
}

/** The invariant, after `step`; returns the counts for the step's own assertions. */
async function agree(step: string): Promise<Map<string, Count>> {
  const all = await counts();
  for (const c of all) {
    assert.equal(c.held_bytes, c.undeleted, `${step}: held_bytes of ${c.inbox_id}`);
    assert.equal(c.used_now, c.rule_now, `${step}: usage of ${c.inbox_id}`);
  }
  return new Map(all.map((c) => [c.inbox_id, c]));
}

const text = (i: number, pad = 0) => `Subject: ${i}\r\n\r\n${'x'.repeat(pad)}message ${i}\r\n`;

test('the counter and the mail path usage agree with the usage rule through every change', async () => {
  const jobs = testJobs(h);
  const a = await h.provision();
  const b = await h.provision();
  const c = await h.provision();
  assert.equal((await agree('provisioned')).get(a.inbox_id)?.held_bytes, 0);

  // Concurrent deliveries into the same inboxes, whole and streamed (over one 256 KiB chunk).
  await deliverMany(h, [a.inbox_id, b.inbox_id, c.inbox_id], 60, (i) => text(i, i * 37));
  await h.deliver(a.inbox_id, text(1000, 600 * 1024), { pieceBytes: 50_000 });
  let now = await agree('delivered');
  let expectedA = Buffer.byteLength(text(1000, 600 * 1024));
  for (let i = 0; i < 60; i += 3) expectedA += Buffer.byteLength(text(i, i * 37));
  assert.equal(now.get(a.inbox_id)?.held_bytes, expectedA, 'the sizes sent, the streamed one included');

  // A redelivery of a stored queue id changes nothing; an open reservation counts its declared size.
  await h.deliver(b.inbox_id, text(1), { queueId: 'SAMEQ1' });
  const heldB = (await agree('first of a queue id')).get(b.inbox_id)?.held_bytes ?? 0;
  await h.deliver(b.inbox_id, text(1), { queueId: 'SAMEQ1' });
  assert.equal((await agree('duplicate')).get(b.inbox_id)?.held_bytes, heldB);
  const versionOf = async (inboxId: string) =>
    Number(
      (
        await h.container
          .resolve<Database>(TOKENS.Database)
          .pool.query('SELECT version FROM inboxes WHERE inbox_id = $1', [inboxId])
      ).rows[0]?.version,
    );
  const versionBefore = await versionOf(c.inbox_id);
  const reserved = await h.messages.reserveAll(
    [b.inbox_id, c.inbox_id].map((inboxId) => ({
      inboxId,
      messageId: newMessageId(),
      queueId: 'OPENQ1',
      sizeBytes: 5000,
      envelopeFrom: 'open@example.com',
      now: h.clock.now(),
    })),
  );
  assert.equal(reserved.kind, 'reserved');
  now = await agree('reserved in two inboxes');
  assert.ok(
    (await versionOf(c.inbox_id)) > versionBefore,
    'a reservation changes the usage: the version moves',
  );
  assert.equal(now.get(b.inbox_id)?.held_bytes, heldB + 5000);

  // Listing and downloading set delete_after; once it passes, the usage drops before any job runs.
  const listed = (
    await h.api.get(`/v1/inboxes/${a.inbox_id}/messages?limit=200`, { token: a.credentials.reader })
  ).json;
  for (const m of listed.messages.slice(0, 5)) await h.api.get(m.url, { token: a.credentials.reader });
  await agree('listed and downloaded');
  h.clock.advance(h.config.downloadGraceSeconds);
  now = await agree('downloads overdue');
  const overdue = now.get(a.inbox_id) as Count;
  assert.ok(overdue.used_now < overdue.held_bytes, 'overdue downloads no longer count');
  await jobs.run('delete-messages');
  now = await agree('delete-messages');
  assert.equal(now.get(a.inbox_id)?.held_bytes, overdue.used_now);
  h.clock.advance(h.config.unclaimedSeconds);
  assert.equal((await agree('unclaimed overdue')).get(a.inbox_id)?.used_now, 0);
  await jobs.run('delete-messages');
  assert.equal((await agree('unclaimed deleted')).get(a.inbox_id)?.held_bytes, 0);

  // The open reservation is released after its time to live.
  h.clock.advance(h.config.reservationTtlSeconds);
  await jobs.run('release-reservations');
  assert.equal((await agree('released')).get(b.inbox_id)?.held_bytes, heldB);

  // A message whose content is lost; then a cancel.
  const lostId = (await h.deliver(c.inbox_id, text(2000))) as string;
  const lost = await h.messages.find(c.inbox_id, lostId);
  assert.ok(lost);
  const beforeLost = (await agree('before lost')).get(c.inbox_id)?.held_bytes ?? 0;
  await h.messages.recordLost(lost, h.clock.now());
  assert.equal((await agree('lost')).get(c.inbox_id)?.held_bytes, beforeLost - lost.sizeBytes);
  // Rows removed by hand (an operator's DELETE) leave the counter right too.
  const db = h.container.resolve<Database>(TOKENS.Database);
  const removed = await db.pool.query(
    `DELETE FROM messages WHERE inbox_id = $1 AND state = 'stored' AND message_id IN (
       SELECT message_id FROM messages WHERE inbox_id = $1 AND state = 'stored' LIMIT 2)`,
    [c.inbox_id],
  );
  assert.equal(removed.rowCount, 2);
  await agree('deleted by hand');
  await h.inboxes.cancel(c.inbox_id, h.clock.now());
  assert.equal((await agree('cancelled')).get(c.inbox_id)?.held_bytes, 0);

  // Expiry marks the messages of several inboxes in one statement; the purge removes the rows.
  const d = await h.provision();
  await deliverMany(h, [b.inbox_id, d.inbox_id], 10, (i) => text(i));
  h.clock.advance(
    (new Date(d.expires_at).getTime() - h.clock.now().getTime()) / 1000 + EXPIRE_SETTLE_SECONDS + 1,
  );
  await agree('expired, not yet swept');
  await jobs.run('expire-inboxes');
  now = await agree('expire-inboxes');
  assert.equal(now.get(b.inbox_id)?.held_bytes, 0);
  assert.equal(now.get(d.inbox_id)?.held_bytes, 0);
  h.clock.advance(h.config.purgeAfterSeconds);
  await jobs.sweep();
  assert.equal((await agree('purged')).size, 0);
});
