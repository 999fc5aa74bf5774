/**
 * expire-inboxes - contract section 3, inbox `live` -> `expired`: "all messages deleted at expiry".
 *
 * Every message of an inbox past expires_at (stored or still in flight) is marked deleted, reason
 * `expired`, and its chunks are freed, so the storage an inbox uses returns to zero once it expires.
 * The rows stay as tombstones until the purge (purge-inboxes.ts), and their deleted_at is this run's
 * "now", which is after expires_at: an expired inbox's status counts what it held at expires_at
 * (lifecycle.usageInstant, storage/usage.ts), so its final counts are the same before and after this job.
 * Readers already hide the messages from expires_at on (DESIGN decision 9), so no version is bumped.
 */
import { defineJob, type Job, type JobDeps } from './job.ts';

export function expireInboxes(deps: JobDeps): Job {
  return defineJob('expire-inboxes', deps, async (run) => {
    await run.repeat(async () => {
      const freed = await deps.store.expireMessages(run.now, {
        rows: run.limits.batchRows,
        bytes: run.limits.batchBytes,
      });
      run.add({ messages: freed.messages, bytes: freed.bytes });
      return freed.messages > 0;
    });
  });
}
