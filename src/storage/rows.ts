/**
 * rows - the column lists and row-to-record mappings shared by the stores.
 */
import type { InboxRecord, InboxSettings, MessageRecord } from '../core/model.ts';

/** What decides whether an inbox takes mail, usage aside (InboxSettings; storage/recipient-lookup.ts). */
export const INBOX_SETTINGS_COLUMNS =
  'i.inbox_id, i.created_at, i.expires_at, i.quota_bytes, i.sender_domains, i.cancelled_at';
export const INBOX_COLUMNS = `${INBOX_SETTINGS_COLUMNS}, i.rejection_count, i.event_seq, i.version`;

/**
 * The messages of inbox `inbox` not yet deleted, in the words of messages_undeleted's key and predicate
 * (migration 20261211000000): no other statement says them, so no other statement can read that index.
 */
export const UNDELETED_OF = (inbox: string): string =>
  `('' || inbox_id) = ${inbox} AND ('' || state) <> 'deleted'`;

/** The names among the text[] parameter `names` that are in the opt-out registry, as one array column. */
export const OPTED_OUT_AMONG = (names: string): string =>
  `ARRAY(SELECT o.domain FROM sender_optouts o WHERE o.domain = ANY(${names}))`;

export interface InboxSettingsRow {
  inbox_id: string;
  created_at: Date;
  expires_at: Date;
  quota_bytes: number;
  sender_domains: string[];
  cancelled_at: Date | null;
}

export interface InboxRow extends InboxSettingsRow {
  rejection_count: number;
  event_seq: number;
  version: number;
}

export const toInboxSettings = (row: InboxSettingsRow): InboxSettings => ({
  inboxId: row.inbox_id,
  createdAt: row.created_at,
  expiresAt: row.expires_at,
  quotaBytes: row.quota_bytes,
  senderDomains: row.sender_domains,
  cancelledAt: row.cancelled_at,
});

export const toInbox = (row: InboxRow): InboxRecord => ({
  ...toInboxSettings(row),
  rejectionCount: row.rejection_count,
  eventSeq: row.event_seq,
  version: row.version,
});

export const MESSAGE_COLUMNS = `m.inbox_id, m.message_id, m.state, m.size_bytes, m.chunk_bytes, m.sha256, m.envelope_from,
  m.from_name, m.from_address, m.subject, m.internet_message_id, m.authentication, m.received_at, m.position,
  m.listed_at, m.downloaded_at, m.delete_after, m.deleted_at, m.deleted_reason`;

export interface MessageRow {
  inbox_id: string;
  message_id: string;
  state: MessageRecord['state'];
  size_bytes: number;
  chunk_bytes: number | null;
  sha256: Buffer | null;
  envelope_from: string;
  from_name: string | null;
  from_address: string | null;
  subject: string | null;
  internet_message_id: string | null;
  authentication: MessageRecord['authentication'];
  received_at: Date | null;
  position: number | null;
  listed_at: Date | null;
  downloaded_at: Date | null;
  delete_after: Date | null;
  deleted_at: Date | null;
  deleted_reason: MessageRecord['deletedReason'];
}

export const toMessage = (row: MessageRow): MessageRecord => ({
  inboxId: row.inbox_id,
  messageId: row.message_id,
  state: row.state,
  sizeBytes: row.size_bytes,
  chunkBytes: row.chunk_bytes,
  sha256: row.sha256,
  envelopeFrom: row.envelope_from,
  fromName: row.from_name,
  fromAddress: row.from_address,
  subject: row.subject,
  internetMessageId: row.internet_message_id,
  authentication: row.authentication,
  receivedAt: row.received_at,
  position: row.position,
  listedAt: row.listed_at,
  downloadedAt: row.downloaded_at,
  deleteAfter: row.delete_after,
  deletedAt: row.deleted_at,
  deletedReason: row.deleted_reason,
});
