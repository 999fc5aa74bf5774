/**
 * forget-idempotency - contract section 5.7: a provision Idempotency-Key is remembered for
 * IDEMPOTENCY_TTL_SECONDS from the first request, then forgotten, and the same key provisions a new
 * inbox. Readers already ignore older records (InboxStore.findProvision, create); this removes them,
 * with the credentials sealed in them. Extend keys go with their inbox (purge-inboxes.ts).
 */
import { cutoffs } from '../core/retention.ts';
import { defineJob, type Job, type JobDeps } from './job.ts';

export function forgetIdempotency(deps: JobDeps): Job {
  return defineJob('forget-idempotency', deps, async (run) => {
    const createdBefore = cutoffs(run.now, deps.settings).provisions;
    await run.repeat(async () => {
      const forgotten = await deps.store.forgetProvisions(createdBefore, run.limits.batchRows);
      run.add({ keys: forgotten });
      return forgotten === run.limits.batchRows;
    });
  });
}
