/**
 * release-reservations - DESIGN decision 4: a reservation the milter made that never became a stored
 * message (Postfix never delivered it) is released RESERVATION_TTL_SECONDS after it was made, which must
 * exceed Postfix's maximal_queue_lifetime (postfix/README.md): released earlier, the quota would be freed
 * for mail Postfix may still deliver. Reason `released`; such a message was never listed, so nobody
 * sees it. The quota it held is free from now on, so the inboxes' versions are bumped (usage-cache.ts).
 * A delivery that still arrives afterwards finds the row deleted and stores nothing.
 */
import { cutoffs } from '../core/retention.ts';
import { defineJob, type Job, type JobDeps } from './job.ts';

export function releaseReservations(deps: JobDeps): Job {
  return defineJob('release-reservations', deps, async (run) => {
    const reservedBefore = cutoffs(run.now, deps.settings).reservations;
    await run.repeat(async () => {
      const released = await deps.store.releaseReservations(reservedBefore, run.now, run.limits.batchRows);
      run.add({ reservations: released.messages, bytes: released.bytes, inboxes: released.inboxes });
      return released.messages === run.limits.batchRows;
    });
  });
}
