/**
 * inbox-status - the InboxStatus object of contract section 2, built from a record and its usage.
 */
import { isExpired } from './lifecycle.ts';
import type { InboxRecord, Usage } from './model.ts';

export interface InboxStatus {
  inbox_id: string;
  address: string;
  state: 'live' | 'expired';
  created_at: string;
  expires_at: string;
  quota_bytes: number;
  quota_used_bytes: number;
  message_count: number;
  rejection_count: number;
  sender_domains: string[];
}

export function presentInboxStatus(
  inbox: InboxRecord,
  usage: Usage,
  now: Date,
  mailDomain: string,
): InboxStatus {
  return {
    inbox_id: inbox.inboxId,
    address: `${inbox.inboxId}@${mailDomain}`,
    state: isExpired(inbox, now) ? 'expired' : 'live',
    created_at: inbox.createdAt.toISOString(),
    expires_at: inbox.expiresAt.toISOString(),
    quota_bytes: inbox.quotaBytes,
    quota_used_bytes: usage.quotaUsedBytes,
    message_count: usage.messageCount,
    rejection_count: inbox.rejectionCount,
    sender_domains: inbox.senderDomains,
  };
}
