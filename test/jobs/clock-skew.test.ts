/**
 * A job run deletes nothing while its host's clock is more than MAX_CLOCK_SKEW_SECONDS off PostgreSQL's
 * (jobs review: a jobs host 20 minutes ahead would have purged live inboxes). The run fails with a log
 * line at error level naming the difference; within the bound it runs as usual.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { MAX_CLOCK_SKEW_SECONDS } from '../../src/core/clock-check.ts';
import { EXPIRE_SETTLE_SECONDS } from '../../src/jobs/expire-inboxes.ts';
import { type Harness, startHarness } from '../support/harness.ts';
import { footprint, testJobs } from '../support/jobs.ts';

let h: Harness;
before(async () => {
  h = await startHarness({});
});
after(() => h.close());

test('a host clock more than 30 s ahead of or behind PostgreSQL: the run does nothing and fails', async () => {
  const inbox = await h.provision();
  await h.deliver(inbox.inbox_id, 'Subject: due\r\n\r\nexpired by the fake clock\r\n');
  h.clock.advance(h.config.unitSeconds + EXPIRE_SETTLE_SECONDS + 1);
  const offBy = (MAX_CLOCK_SKEW_SECONDS + 5) * 1000;
  for (const [skew, words] of [
    [offBy, /this host's clock is 35 s ahead of PostgreSQL's/],
    [-offBy, /this host's clock is 35 s behind PostgreSQL's/],
  ] as const) {
    const jobs = testJobs(h, {}, () => Date.now() + skew);
    const report = await jobs.run('expire-inboxes');
    assert.equal(report.ran, false);
    assert.equal(report.complete, false);
    assert.match(report.error ?? '', words);
    assert.deepEqual(
      jobs.lines.map((l) => [l.level, l.msg, l.job]),
      [['error', 'job failed', 'expire-inboxes']],
    );
    assert.equal((await footprint(h, inbox.inbox_id)).undeleted, 1, 'nothing deleted');
  }
  // Within the bound the same run expires the inbox's message.
  const near = testJobs(h, {}, () => Date.now() + (MAX_CLOCK_SKEW_SECONDS - 5) * 1000);
  const report = await near.run('expire-inboxes');
  assert.equal(report.error, undefined);
  assert.equal(report.counts.messages, 1);
  assert.equal((await footprint(h, inbox.inbox_id)).undeleted, 0);
});
