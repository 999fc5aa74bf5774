/**
 * jobs - the lifecycle jobs in the order one sweep runs them, and the limits they share.
 *
 * Order: reservations are released and expired inboxes emptied (their content freed) before anything
 * else; delete-messages then finds only messages of live inboxes due; purge-inboxes finds expired
 * inboxes already down to tombstones; the retention jobs follow. Each job stands alone all the same:
 * any order, any interleaving with other processes, gives the same end state.
 */
import type { Clock } from '../core/clock.ts';
import type { SweeperStore } from '../core/ports.ts';
import type { RetentionSettings } from '../core/retention.ts';
import type { Log } from '../log.ts';
import { deleteMessages } from './delete-messages.ts';
import { dropRateBuckets } from './drop-rate-buckets.ts';
import { dropRejections } from './drop-rejections.ts';
import { dropTombstones } from './drop-tombstones.ts';
import { expireInboxes } from './expire-inboxes.ts';
import { forgetIdempotency } from './forget-idempotency.ts';
import type { Job, SweepLimits } from './job.ts';
import { purgeInboxes } from './purge-inboxes.ts';
import { releaseReservations } from './release-reservations.ts';

export interface JobSettings extends RetentionSettings {
  sweepBatchSize: number;
}

/** 64 MiB of content freed per statement: a few hundred ms of TOAST deletes at most. */
const BATCH_BYTES = 64 * 1024 * 1024;
/** 1,000 statements per run (500,000 rows at the default batch size); the next run carries on. */
const MAX_BATCHES = 1000;
const SCAN_PAGES = 10;

export function sweepLimits(settings: JobSettings, overrides: Partial<SweepLimits> = {}): SweepLimits {
  return {
    batchRows: settings.sweepBatchSize,
    batchBytes: BATCH_BYTES,
    maxBatches: MAX_BATCHES,
    scanPages: SCAN_PAGES,
    ...overrides,
  };
}

export function createJobs(
  store: SweeperStore,
  clock: Clock,
  settings: JobSettings,
  log: Log,
  limits: Partial<SweepLimits> = {},
  wallClock?: () => number,
): Job[] {
  const deps = { store, clock, log, settings, limits: sweepLimits(settings, limits), wallClock };
  return [
    releaseReservations(deps),
    expireInboxes(deps),
    deleteMessages(deps),
    purgeInboxes(deps),
    dropTombstones(deps),
    dropRejections(deps),
    forgetIdempotency(deps),
    dropRateBuckets(deps),
  ];
}
