/**
 * lifecycle - contract section 3's timers, evaluated on read (DESIGN decision 9).
 *
 * Nothing here waits for a job: an inbox past expires_at is expired, past the purge delay it no longer
 * exists, and a message past delete_after is deleted, whether or not the sweeper has run.
 */
import type { DeletionReason, InboxRecord, MessageRecord } from './model.ts';

export interface LifecycleSettings {
  purgeAfterSeconds: number;
  goneSeconds: number;
}

const ms = (seconds: number): number => seconds * 1000;

/** Purged inboxes answer as if they never existed (401 over HTTP, `no such inbox` over SMTP). */
export function isPurged(
  inbox: Pick<InboxRecord, 'expiresAt' | 'cancelledAt'>,
  now: Date,
  settings: LifecycleSettings,
): boolean {
  const end = inbox.cancelledAt
    ? inbox.expiresAt.getTime()
    : inbox.expiresAt.getTime() + ms(settings.purgeAfterSeconds);
  return now.getTime() >= end;
}

export const isExpired = (inbox: Pick<InboxRecord, 'expiresAt'>, now: Date): boolean =>
  now.getTime() >= inbox.expiresAt.getTime();

/** The instant the inbox's counts are taken at: now while live, expires_at once expired ("final counts"). */
export const usageInstant = (inbox: Pick<InboxRecord, 'expiresAt'>, now: Date): Date =>
  isExpired(inbox, now) ? inbox.expiresAt : now;

export type MessageFate =
  | { kind: 'missing' }
  | { kind: 'available'; message: MessageRecord }
  | { kind: 'gone'; reason: DeletionReason; at: Date };

/**
 * What a download of this message finds now: in-flight deliveries are missing, a message whose
 * deletion time has passed is gone (410) for `goneSeconds`, then missing (404). A message already
 * marked deleted is gone even if `now` is a moment before its deletion time: a job whose clock was
 * there first has freed its content (until 2026-11-25 such a request found no bytes and called the
 * message `lost`, logging an error).
 */
export function messageFate(
  message: MessageRecord | undefined,
  inbox: InboxRecord,
  now: Date,
  settings: LifecycleSettings,
): MessageFate {
  if (!message || message.state === 'in_flight' || message.position === null) return { kind: 'missing' };
  const deletion = deletionOf(message, inbox);
  if (deletion && (message.state === 'deleted' || deletion.at.getTime() <= now.getTime())) {
    if (now.getTime() >= deletion.at.getTime() + ms(settings.goneSeconds)) return { kind: 'missing' };
    return { kind: 'gone', reason: deletion.reason, at: deletion.at };
  }
  return { kind: 'available', message };
}

/** The earliest of: a recorded deletion, delete_after, the inbox's expiry. */
function deletionOf(
  message: MessageRecord,
  inbox: InboxRecord,
): { at: Date; reason: DeletionReason } | undefined {
  const candidates: { at: Date; reason: DeletionReason }[] = [];
  if (message.deletedAt && message.deletedReason) {
    const reason =
      message.deletedReason === 'cancelled' || message.deletedReason === 'released'
        ? 'expired'
        : message.deletedReason;
    candidates.push({ at: message.deletedAt, reason });
  }
  if (message.deleteAfter) {
    candidates.push({ at: message.deleteAfter, reason: message.downloadedAt ? 'downloaded' : 'unclaimed' });
  }
  candidates.push({ at: inbox.expiresAt, reason: 'expired' });
  candidates.sort((a, b) => a.at.getTime() - b.at.getTime());
  return candidates[0];
}
