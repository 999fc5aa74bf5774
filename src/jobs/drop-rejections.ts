/**
 * drop-rejections - contract section 3, rejection record: "deleted 1 hour after poll first lists it"
 * (REJECTION_RETENTION_SECONDS). Poll stopped listing it then, and the held count that caps new records
 * (MAX_REJECTIONS) already ignores it; `rejection_count` is a counter of its own and does not change.
 */
import { cutoffs } from '../core/retention.ts';
import { defineJob, type Job, type JobDeps } from './job.ts';

export function dropRejections(deps: JobDeps): Job {
  return defineJob('drop-rejections', deps, async (run) => {
    const listedBefore = cutoffs(run.now, deps.settings).rejections;
    await run.repeat(async () => {
      const dropped = await deps.store.dropRejections(listedBefore, run.limits.batchRows);
      run.add({ rejections: dropped });
      return dropped === run.limits.batchRows;
    });
  });
}
