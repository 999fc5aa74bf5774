/**
 * expire-inboxes - contract section 3, inbox `live` -> `expired`: "all messages deleted at expiry".
 *
 * Every message of an inbox EXPIRE_SETTLE_SECONDS past expires_at (stored or still in flight) is marked
 * deleted, reason `expired`, and its chunks are freed, so the storage an inbox uses returns to zero once
 * it expires. The rows stay as tombstones until the purge (purge-inboxes.ts), and their deleted_at is
 * this run's "now", which is after expires_at: an expired inbox's status counts what it held at
 * expires_at (lifecycle.usageInstant, storage/usage.ts), so its final counts are the same before and
 * after this job. Readers already hide the messages from expires_at on (DESIGN decision 9); the
 * held-bytes trigger moves the inbox's version as for any change of what it holds.
 */
import { addSeconds } from '../core/clock.ts';
import { defineJob, type Job, type JobDeps } from './job.ts';

/**
 * An inbox is expired here only this long after its expires_at. An extend checks expires_at against
 * the API host's clock once it holds the inbox row; a job host whose clock runs ahead by less than this
 * cannot free the messages of an inbox such an extend keeps live. Readers hide them from expires_at on.
 */
export const EXPIRE_SETTLE_SECONDS = 60;

export function expireInboxes(deps: JobDeps): Job {
  return defineJob('expire-inboxes', deps, async (run) => {
    const expiredBefore = addSeconds(run.now, -EXPIRE_SETTLE_SECONDS);
    await run.repeat(async () => {
      const freed = await deps.store.expireMessages(run.now, expiredBefore, {
        rows: run.limits.batchRows,
        bytes: run.limits.batchBytes,
      });
      run.add({ messages: freed.messages, bytes: freed.bytes });
      return freed.messages > 0;
    });
  });
}
