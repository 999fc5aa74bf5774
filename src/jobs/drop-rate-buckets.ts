/**
 * drop-rate-buckets - the rate buckets (DESIGN decision 11) of purged inboxes. purge-inboxes removes an
 * inbox's buckets with it; this catches the rest: buckets of inboxes past their purge instant that the
 * purge has not reached, and any whose inbox row is gone (written by an API process whose clock lagged
 * the purge). rate_buckets has no foreign key (it is UNLOGGED), so nothing cascades.
 *
 * Each run looks at the next `scanPages` pages of the table in key order, going round from where the
 * last run of this process stopped, so a run's cost is bounded however many inboxes there are.
 */
import { cutoffs } from '../core/retention.ts';
import { defineJob, type Job, type JobDeps } from './job.ts';

export function dropRateBuckets(deps: JobDeps): Job {
  let cursor: { inboxId: string; bucket: string } | null = null;
  return defineJob('drop-rate-buckets', deps, async (run) => {
    const purgeCutoff = cutoffs(run.now, deps.settings).purge;
    let pages = 0;
    await run.repeat(async () => {
      const page = await deps.store.dropRateBuckets(cursor, run.now, purgeCutoff, run.limits.batchRows);
      run.add({ buckets: page.deleted });
      cursor = page.last;
      return cursor !== null && ++pages < run.limits.scanPages;
    });
  });
}
