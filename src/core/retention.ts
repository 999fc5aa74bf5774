/**
 * retention - when each kind of record is due to be removed for good (contract sections 3 and 8): the
 * cutoffs the lifecycle jobs hand to the SweeperStore.
 *
 * These are the rules lifecycle.ts applies on read, turned around: a record is removed only once every
 * reader already treats it as gone, so a job that runs late changes no answer (DESIGN decision 9).
 */
import { addSeconds } from './clock.ts';
import type { LifecycleSettings } from './lifecycle.ts';

export interface RetentionSettings extends LifecycleSettings {
  rejectionRetentionSeconds: number;
  idempotencyTtlSeconds: number;
  reservationTtlSeconds: number;
}

export interface Cutoffs {
  /** Inboxes that expired at or before this instant are purged (cancelled ones at expires_at). */
  purge: Date;
  /** Messages deleted at or before this instant answer 404: their rows may go. */
  gone: Date;
  /** Rejections first listed at or before this instant are no longer listed. */
  rejections: Date;
  /** Provision idempotency records created before this instant are forgotten. */
  provisions: Date;
  /** Reservations made at or before this instant can no longer be delivered: Postfix has given up. */
  reservations: Date;
}

export function cutoffs(now: Date, settings: RetentionSettings): Cutoffs {
  return {
    purge: addSeconds(now, -settings.purgeAfterSeconds),
    gone: addSeconds(now, -settings.goneSeconds),
    rejections: addSeconds(now, -settings.rejectionRetentionSeconds),
    provisions: addSeconds(now, -settings.idempotencyTtlSeconds),
    reservations: addSeconds(now, -settings.reservationTtlSeconds),
  };
}

/** A stored copy is lost when its chunks hold other than its size (contract section 3, reason `lost`). */
export const isLostCopy = (copy: { sizeBytes: number; storedBytes: number }): boolean =>
  copy.storedBytes !== copy.sizeBytes;
