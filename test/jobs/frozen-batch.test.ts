/**
 * A batch's transaction is a lease (sweeper-store.ts #batch): a jobs process that freezes within a batch
 * (a paused VM, a stopped process, whose kernel still answers TCP keepalives) keeps the row locks the
 * batch took for no longer than the job lock's lease, so the deliveries that need those rows go
 * through again; and the process, on waking, finds its batch gone and fails its run cleanly, leaving the
 * work to the next run.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { after, before, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { newMessageId } from '../../src/core/ids.ts';
import { type Harness, startHarness } from '../support/harness.ts';
import { scalar, testJobs } from '../support/jobs.ts';

let h: Harness;
before(async () => {
  h = await startHarness();
});
after(async () => {
  await h.close();
});

test('a process that froze within a batch holds its row locks no longer than the lease, and its run fails on waking', async () => {
  const lease = 1_500;
  const inbox = await h.provision();
  const held = () => scalar(h, 'SELECT held_bytes FROM inboxes WHERE inbox_id = $1', [inbox.inbox_id]);
  const reservation = (queueId: string) => ({
    inboxId: inbox.inbox_id,
    messageId: newMessageId(),
    queueId,
    sizeBytes: 100,
    envelopeFrom: 'sender@example.com',
    now: h.clock.now(),
  });
  assert.equal(await h.messages.reserve(reservation('OLD1')), 'reserved');
  h.clock.advance(h.config.reservationTtlSeconds + 1);

  // Releases the old reservation in a batch that stops before its COMMIT: the held-bytes trigger has
  // updated the inbox row, and the batch keeps it locked.
  const holder = spawn(
    process.execPath,
    [
      'test/support/hold-sweeper-batch.ts',
      h.database.url,
      String(lease),
      'release-reservations',
      h.clock.now().toISOString(),
      JSON.stringify(h.config),
    ],
    { stdio: ['pipe', 'pipe', 'inherit'] },
  );
  const said = createInterface({ input: holder.stdout })[Symbol.asyncIterator]();
  const exited = once(holder, 'exit');
  const other = new pg.Client({ connectionString: h.database.url });
  await other.connect();
  try {
    assert.equal((await said.next()).value, 'holding');
    // Frozen: its kernel still answers for its connections, but it sends nothing.
    holder.kill('SIGSTOP');
    await assert.rejects(
      other.query('SELECT 1 FROM inboxes WHERE inbox_id = $1 FOR UPDATE NOWAIT', [inbox.inbox_id]),
      { code: '55P03' },
      'within the lease the batch holds the inbox row',
    );

    // A reservation into the inbox (what the milter makes for each delivery) waits for that row.
    const reserving = h.messages.reserve(reservation('NEW1'));
    reserving.catch(() => {});
    const outcome = await Promise.race([reserving, sleep(4 * lease).then(() => 'still waiting')]);
    assert.equal(outcome, 'reserved', 'the reservation went through once the lease was over');

    // Awake, the process finds its connection ended: the batch fails, and so does the run, logged.
    holder.kill('SIGCONT');
    holder.stdin.write('carry on\n');
    const line = JSON.parse(String((await said.next()).value));
    assert.deepEqual(
      { level: line.level, msg: line.msg, job: line.job, batches: line.batches, complete: line.complete },
      { level: 'error', msg: 'job failed', job: 'release-reservations', batches: 1, complete: false },
    );
    assert.equal(line.reservations, undefined, 'nothing counted as released');
    assert.match(line.error, /terminat|not queryable/i);
    assert.deepEqual(await exited, [0, null]);
  } finally {
    holder.kill('SIGKILL');
    await other.end();
  }

  // Nothing of its batch was kept: the old reservation is still in flight, and the quota counts both.
  assert.equal(
    await scalar(h, `SELECT count(*) FROM messages WHERE inbox_id = $1 AND state = 'in_flight'`, [
      inbox.inbox_id,
    ]),
    2,
  );
  assert.equal(await held(), 200);
  // The next run releases it.
  const report = await testJobs(h).run('release-reservations');
  assert.deepEqual(report.counts, { reservations: 1, bytes: 100, inboxes: 1 });
  assert.equal(await held(), 100);
});
