/**
 * inbox-gate - whether an inbox takes mail at all, now (contract section 4, first three rows): the
 * checks the policy daemon makes at RCPT and the milter makes again at end of data.
 */
import { isExpired, isPurged, type LifecycleSettings } from './lifecycle.ts';
import type { InboxSettings } from './model.ts';
import type { SmtpReplies } from './smtp-replies.ts';
import type { Refusal } from './verdict.ts';

/** The refusal for an inbox that takes no mail, or null for a live one. A purged inbox is "no such inbox". */
export function closedInbox(
  inbox: InboxSettings | undefined,
  now: Date,
  replies: SmtpReplies,
  lifecycle: LifecycleSettings,
): Refusal | null {
  if (!inbox || isPurged(inbox, now, lifecycle)) return replies.noSuchInbox;
  if (inbox.cancelledAt) return replies.inboxCancelled;
  if (isExpired(inbox, now)) return replies.inboxExpired;
  return null;
}

export const freeBytes = (target: { inbox: InboxSettings; usedBytes: number }): number =>
  Math.max(0, target.inbox.quotaBytes - target.usedBytes);
