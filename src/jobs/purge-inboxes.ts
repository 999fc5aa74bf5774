/**
 * purge-inboxes - contract section 3, `expired` -> purged PURGE_AFTER_SECONDS after expires_at, and
 * cancelled -> purged at expires_at (the end of the paid lifetime).
 *
 * The inbox's message rows go first, a batch at a time, then the inbox row with its credentials,
 * rejections and extend idempotency keys (ON DELETE CASCADE) and its rate buckets. Readers already
 * answer 401 and `no such inbox` from the purge instant on (lifecycle.isPurged). A message still
 * holding content (expire-inboxes has not reached it yet) makes the inbox wait for a later run, so every
 * statement here stays small; expire-inboxes runs first in each sweep.
 */
import { cutoffs } from '../core/retention.ts';
import { defineJob, type Job, type JobDeps } from './job.ts';

export function purgeInboxes(deps: JobDeps): Job {
  return defineJob('purge-inboxes', deps, async (run) => {
    const cutoff = cutoffs(run.now, deps.settings).purge;
    const rows = run.limits.batchRows;
    run.add({ inboxes: 0, messages: 0, waiting: 0 });
    await run.repeat(async () => {
      const due = await deps.store.inboxesToPurge(run.now, cutoff, rows);
      let purged = 0;
      for (const inboxId of due) {
        await run.repeat(async () => {
          const step = await deps.store.purgeInbox(inboxId, run.now, cutoff, rows);
          run.add({ inboxes: step.purged ? 1 : 0, messages: step.messages, waiting: step.waiting ? 1 : 0 });
          if (step.purged) purged++;
          return step.messages === rows;
        });
      }
      // Due inboxes that are all waiting would only come back: stop until expire-inboxes has run.
      return due.length === rows && purged > 0;
    });
  });
}
