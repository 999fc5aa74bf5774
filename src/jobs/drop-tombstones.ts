/**
 * drop-tombstones - contract section 3, message `deleted` -> unknown: GONE_SECONDS after its deletion a
 * message's row goes, and its id answers 404 (readers already answer 404 then: lifecycle.messageFate).
 *
 * Only rows of live inboxes go here; an expired inbox keeps its rows until its purge, since its status
 * counts what it held at expires_at. A row also stays until Postfix can no longer deliver its queue file
 * (RESERVATION_TTL_SECONDS after its reservation, as release-reservations waits): it is the only record
 * of that (queue id, inbox) delivery, and a redelivery of a message whose 250 was lost (the receiver
 * died after its commit) found no row once it had gone, and was stored a second time, past the quota.
 * Cascades any chunks a row still has (a copy recorded lost by a download).
 */
import { cutoffs } from '../core/retention.ts';
import { defineJob, type Job, type JobDeps } from './job.ts';

export function dropTombstones(deps: JobDeps): Job {
  return defineJob('drop-tombstones', deps, async (run) => {
    const { gone, reservations } = cutoffs(run.now, deps.settings);
    await run.repeat(async () => {
      const dropped = await deps.store.dropTombstones(gone, reservations, run.now, run.limits.batchRows);
      run.add({ messages: dropped });
      return dropped === run.limits.batchRows;
    });
  });
}
