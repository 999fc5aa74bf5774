/**
 * model - the records the core reasons about, and the store ports it needs (STYLE 6, 10).
 *
 * Storage implements these interfaces; the core never sees SQL. Every method is scoped to one inbox
 * where the domain allows (STYLE 16).
 */
export type Role = 'owner' | 'reader';

export interface InboxRecord {
  inboxId: string;
  createdAt: Date;
  expiresAt: Date;
  quotaBytes: number;
  senderDomains: string[];
  cancelledAt: Date | null;
  rejectionCount: number;
  /** Last position handed out in this inbox's event sequence (DESIGN decision 8). */
  eventSeq: number;
  /** Changes whenever what a poll lists changes, by data (time rules aside); see core/poll-cache.ts. */
  version: number;
}

/**
 * What decides whether an inbox takes mail, usage aside. Changes only with an extend, a sender-domains
 * update, a cancel or a purge, and each is announced (migrations/20261129000000_inbox_change_notify.ts),
 * so the policy daemon may keep it (storage/recipient-lookup.ts).
 */
export type InboxSettings = Pick<
  InboxRecord,
  'inboxId' | 'createdAt' | 'expiresAt' | 'quotaBytes' | 'senderDomains' | 'cancelledAt'
>;

export interface Caller {
  role: Role;
  inbox: InboxRecord;
}

export interface Usage {
  messageCount: number;
  quotaUsedBytes: number;
}

export type Authentication = {
  dmarc: { result: string; domain: string | null };
  dkim: { result: string; domain: string | null };
  spf: { result: string; domain: string | null };
};

export type DeletionReason = 'downloaded' | 'unclaimed' | 'expired' | 'lost';
/** As recorded: also 'cancelled' (never shown: a cancelled inbox answers 410 inbox_cancelled) and
 * 'released' (a reservation that never became a message, so it has no position and is never listed). */
export type RecordedDeletionReason = DeletionReason | 'cancelled' | 'released';
export type MessageState = 'in_flight' | 'stored' | 'deleted';

export interface MessageRecord {
  inboxId: string;
  messageId: string;
  state: MessageState;
  sizeBytes: number;
  chunkBytes: number | null;
  /**
   * The content's SHA-256, kept only by messages stored before the mail path stopped computing it (a
   * digest of every delivered byte, used for nothing but the ETag); null for every newer message.
   */
  sha256: Buffer | null;
  envelopeFrom: string;
  fromName: string | null;
  fromAddress: string | null;
  subject: string | null;
  internetMessageId: string | null;
  authentication: Authentication | null;
  receivedAt: Date | null;
  position: number | null;
  listedAt: Date | null;
  downloadedAt: Date | null;
  deleteAfter: Date | null;
  deletedAt: Date | null;
  deletedReason: RecordedDeletionReason | null;
  /** Bytes the stored chunks hold; read by MessageStore.find only (a download checks it before sending). */
  storedBytes?: number;
}

export type RejectionReason = 'quota' | 'sender_not_allowed' | 'sender_opted_out';

export interface RejectionRecord {
  position: number;
  at: Date;
  envelopeFrom: string;
  reason: RejectionReason;
  senderDomain: string | null;
  sizeBytes: number;
}

/** One element of an inbox's event sequence, oldest first. */
export type InboxEvent =
  | { kind: 'message'; position: number; message: MessageRecord }
  | { kind: 'rejection'; position: number; rejection: RejectionRecord; listedAt: Date | null };
