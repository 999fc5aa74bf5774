/**
 * drop-tombstones - contract section 3, message `deleted` -> unknown: GONE_SECONDS after its deletion a
 * message's row goes, and its id answers 404 (readers already answer 404 then: lifecycle.messageFate).
 *
 * Only rows of live inboxes go here; an expired inbox keeps its rows until its purge, since its status
 * counts what it held at expires_at. Cascades any chunks a row still has (a copy recorded lost by a
 * download).
 */
import { cutoffs } from '../core/retention.ts';
import { defineJob, type Job, type JobDeps } from './job.ts';

export function dropTombstones(deps: JobDeps): Job {
  return defineJob('drop-tombstones', deps, async (run) => {
    const gone = cutoffs(run.now, deps.settings).gone;
    await run.repeat(async () => {
      const dropped = await deps.store.dropTombstones(gone, run.now, run.limits.batchRows);
      run.add({ messages: dropped });
      return dropped === run.limits.batchRows;
    });
  });
}
