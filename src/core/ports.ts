/**
 * ports - what the core needs from storage. storage/ implements each against Postgres.
 *
 * Invariants every implementation keeps:
 * - positions in an inbox's event sequence are assigned under that inbox's row lock and committed in
 *   order, so a reader that sees position p also sees every position below p (DESIGN decision 8);
 * - reservations and deliveries are keyed by (inbox, queue id): repeating one is harmless (decision 5);
 * - "now" is always passed in; no store reads the database clock.
 */
import type {
  Authentication,
  Caller,
  InboxEvent,
  InboxRecord,
  InboxSettings,
  MessageRecord,
  RejectionReason,
  Role,
  Usage,
} from './model.ts';

export interface NewInbox {
  inboxId: string;
  createdAt: Date;
  expiresAt: Date;
  quotaBytes: number;
  senderDomains: string[];
  ownerHash: Buffer;
  readerHash: Buffer;
}

export interface ProvisionClaim {
  keyHash: Buffer;
  requestHash: Buffer;
  sealedResponse: Buffer;
  /** Records created before this instant are forgotten (IDEMPOTENCY_TTL_SECONDS). */
  forgetBefore: Date;
  now: Date;
}

export type StoredProvision = { requestHash: Buffer; sealedResponse: Buffer };

export interface InboxStore {
  /**
   * Creates the inbox. With a claim, the Idempotency-Key record is written in the same transaction; if a
   * live record for the key already exists nothing is created and that record is returned instead.
   */
  create(
    inbox: NewInbox,
    claim?: ProvisionClaim,
  ): Promise<{ created: true } | { created: false; existing: StoredProvision }>;
  /** The record stored for a provision key, unless forgotten (created before `forgetBefore`). Reads only. */
  findProvision(keyHash: Buffer, forgetBefore: Date): Promise<StoredProvision | undefined>;
  /** Messages held at `asOf`: in flight, stored and downloaded ones not yet deleted at that instant. */
  usage(inboxId: string, asOf: Date): Promise<Usage>;
  /**
   * Adds `seconds` to expires_at unless it has passed or the inbox is cancelled (a cancel that commits
   * after the caller's credential check wins), recording the response under the key if one is given.
   * A key already recorded for this inbox returns its stored response and changes nothing.
   */
  extend(
    inboxId: string,
    seconds: number,
    /** Read once the inbox row is locked: a wait for the lock does not leave the check with a stale time. */
    clock: () => Date,
    key: Buffer | undefined,
    respond: (inbox: InboxRecord, usage: Usage, now: Date) => unknown,
  ): Promise<
    | { kind: 'extended' | 'replayed'; response: unknown }
    | { kind: 'expired' }
    | { kind: 'cancelled'; cancelledAt: Date }
  >;
  /** Replaces the list unless the inbox has expired or is cancelled. */
  setSenderDomains(
    inboxId: string,
    domains: string[],
    now: Date,
  ): Promise<
    { kind: 'updated'; inbox: InboxRecord } | { kind: 'expired' } | { kind: 'cancelled'; cancelledAt: Date }
  >;
  /**
   * The inbox a delivery is for, with the bytes its quota holds at `asOf` (in flight, stored and
   * downloaded messages not yet deleted), and which of `senderDomains` are opted out, read together
   * (the policy daemon asks on every RCPT: one statement, not two). Reads only.
   */
  findForDelivery(inboxId: string, asOf: Date, senderDomains?: string[]): Promise<DeliveryTarget | undefined>;
  /** The inbox, without its usage. Reads only. */
  find(inboxId: string): Promise<InboxRecord | undefined>;
  /**
   * Those of the inboxes that exist, without usage, and which of `senderDomains` are opted out, read in
   * one statement (the milter's end of message). Reads only.
   */
  findWithOptOuts(
    inboxIds: string[],
    senderDomains: string[],
  ): Promise<{ inboxes: Map<string, InboxRecord>; optedOut: string[] }>;
  /**
   * Marks the inbox cancelled and deletes its messages; undefined for an unknown inbox, and for one
   * expired and not cancelled (contract section 3 cancels a live inbox; an expired one keeps its final
   * view until its purge).
   */
  cancel(inboxId: string, now: Date): Promise<InboxRecord | undefined>;
}

/** The recipient's inbox as RCPT reads it first (no usage), and which of the names asked are opted out. */
export interface RecipientTarget {
  inbox: InboxSettings;
  optedOut: string[];
}

export interface RecipientLookup {
  /**
   * Reads only; an inbox that does not exist (or was purged) is undefined. May answer from what this
   * process read before, kept exact by PostgreSQL's change announcements (storage/recipient-lookup.ts).
   */
  find(inboxId: string, senderDomains: string[]): Promise<RecipientTarget | undefined>;
}

export interface DeliveryTarget {
  inbox: InboxRecord;
  usedBytes: number;
  /** The sender domains asked about that are in the opt-out registry. */
  optedOut: string[];
}

export interface OptOutStore {
  /** The subset of `domains` that is opted out (exact names; the caller expands parents). */
  findOptedOut(domains: string[]): Promise<string[]>;
  add(domain: string, now: Date): Promise<boolean>;
  remove(domain: string): Promise<boolean>;
  list(): Promise<{ domain: string; createdAt: Date }[]>;
}

export type Bucket = 'poll' | 'download';

export interface AdmissionRequest {
  credentialHash: Buffer;
  /** The inbox the request is about (the path's id). */
  inboxId: string;
  ownerOnly: boolean;
  bucket: Bucket | null;
  /** Take a token only if the request is well formed; a malformed one never counts. */
  take: boolean;
  withUsage: boolean;
  /** Skip the usage when the inbox is still at this version (the caller holds it); null: always read. */
  knownUsageVersion: number | null;
  now: Date;
  /** Inboxes that expired before this instant are purged. */
  purgeCutoff: Date;
}

export interface Admission {
  role: Role;
  inbox: InboxRecord;
  /**
   * 'taken' or 'refused' only when the credential is the inbox's own, the inbox is neither cancelled
   * nor purged and the role may do the operation; otherwise nothing was touched ('skipped').
   */
  bucket: 'taken' | 'refused' | 'skipped';
  retryAfterSeconds?: number;
  /** Present when asked for and not already known; `changesAt` as UsageCache.remember takes it. */
  usage?: Usage & { changesAt: Date | null };
}

export interface Gatekeeper {
  /** Finds the credential's inbox and takes a rate token in one step; undefined for an unknown credential. */
  admit(request: AdmissionRequest): Promise<Admission | undefined>;
}

export interface Reservation {
  inboxId: string;
  messageId: string;
  queueId: string;
  sizeBytes: number;
  envelopeFrom: string;
  now: Date;
  /**
   * The milter process (its incarnation) making it, so that what a dead one never answered can be
   * released (mail/orphan-sweep.ts); null or absent: no owner, released only by the clean-up job.
   */
  reservedBy?: string | null;
}

export interface DeliverySummary {
  fromName: string | null;
  fromAddress: string | null;
  subject: string | null;
  internetMessageId: string | null;
  authentication: Authentication | null;
}

export interface Delivery {
  inboxId: string;
  queueId: string;
  /** Used when the milter made no reservation for this queue id (e.g. delivered after a restore). */
  envelopeFrom: string;
  summary: DeliverySummary;
  now: Date;
}

export interface RejectionInput {
  inboxId: string;
  reason: RejectionReason;
  envelopeFrom: string;
  senderDomain: string | null;
  sizeBytes: number;
  /** For `sender_not_allowed`, retries of one Message-ID are one event. */
  internetMessageId: string | null;
  now: Date;
}

export interface ListWindow {
  afterPosition: number;
  limit: number;
  now: Date;
  includeMessages: boolean;
  /** Rejections first listed before this instant are no longer held. */
  rejectionsListedAfter: Date;
}

/**
 * Every method that changes what a poll lists or the inbox's usage (reserve, store, markListed,
 * markRejectionsListed, markDownloaded, recordLost, an event from recordRejection) also bumps the
 * inbox's `version` in the same transaction: the API's caches (core/poll-cache.ts, core/usage-cache.ts)
 * trust a page or a usage only while the version is unchanged. A job that deletes rows the time rules
 * already hide need not bump it; anything else that changes them must.
 */
/** What a delivery into one inbox came to (MessageStore.store). */
export interface StoreOutcome {
  kind: 'stored' | 'duplicate' | 'cancelled' | 'expired' | 'released';
  messageId: string;
}

export interface MessageStore {
  /**
   * Reserves `sizeBytes` of quota for a delivery in flight if it fits in the free quota, atomically
   * with the check (DESIGN decision 4). Repeating a reservation for the same queue id is 'exists'.
   */
  reserve(reservation: Reservation): Promise<'reserved' | 'exists' | 'over_quota'>;
  /**
   * Reserves one message in every inbox, all or nothing: inboxes are locked in id order, and if any
   * reservation does not fit, none is made and the inboxes that are full are returned. A queue id
   * already reserved in an inbox counts as reserved there.
   */
  reserveAll(
    reservations: Reservation[],
  ): Promise<{ kind: 'reserved' } | { kind: 'over_quota'; inboxIds: string[] }>;
  /**
   * Removes these reservations if they are still in flight: only for a message the MTA did not queue
   * (its accept never reached it). The rows are deleted, not kept as tombstones, so that should the
   * MTA deliver the message after all, the receiver stores it as a delivery without a reservation
   * rather than taking it for one already handled. Returns how many were removed.
   */
  withdrawReservations(keys: readonly MessageKey[]): Promise<number>;
  /**
   * Streams the body into chunks and makes the message visible at the next event position, all in one
   * transaction. A queue id already stored for this inbox is a 'duplicate' and stores nothing; so is
   * a delivery into an inbox cancelled, or expired more than a minute ago ('cancelled', 'expired':
   * the chunks written are removed in the same transaction), or into a row the cancel, the expiry
   * sweep or the reservation release already deleted (the same kinds, and 'released').
   * The body iterable is consumed exactly once, chunk by chunk; memory is bounded by the chunk size.
   */
  store(delivery: Delivery, body: AsyncIterable<Buffer>): Promise<StoreOutcome>;
  /** The message, with `storedBytes` (the bytes its chunks hold) filled in. */
  find(inboxId: string, messageId: string): Promise<MessageRecord | undefined>;
  /** Events after a position, oldest first, at most limit + 1 of each kind, from one snapshot. */
  listEvents(inboxId: string, window: ListWindow): Promise<InboxEvent[]>;
  /** Sets listed_at and delete_after (only ever earlier) on first listing; returns the new delete_after per id. */
  markListed(inboxId: string, messageIds: string[], now: Date, deleteAfter: Date): Promise<Map<string, Date>>;
  markRejectionsListed(inboxId: string, positions: number[], now: Date): Promise<void>;
  /** Sets downloaded_at once and moves delete_after to at most `deleteAfter`. */
  markDownloaded(inboxId: string, messageId: string, now: Date, deleteAfter: Date): Promise<void>;
  /** The bytes [start, end] of a stored message, in order, a chunk at a time. */
  readRange(message: MessageRecord, start: number, end: number): AsyncIterable<Buffer>;
  /** Records a stored message whose stored copy is incomplete as deleted with reason 'lost' (contract 3). */
  recordLost(message: MessageRecord, now: Date): Promise<void>;
  recordRejection(
    input: RejectionInput,
    maxHeld: number,
    heldListedAfter: Date,
  ): Promise<'recorded' | 'counted'>;
}

export type { Caller };

/** The reverse DNS of a client address: any PTR record is enough (contract section 4). */
export interface ReverseDns {
  /** 'none' for NXDOMAIN or no PTR data; 'unavailable' for a timeout or server failure. */
  lookup(address: string): Promise<'found' | 'none' | 'unavailable'>;
}

/** What the receiving server concluded about a message's origin (mailauth's verdict, summarized). */
export interface AuthVerdict {
  /** The `From:` domain DMARC was evaluated for; null when the header has no single domain. */
  fromDomain: string | null;
  /**
   * Every `From:` domain when there are several (several mailboxes of different domains, or several
   * `From:` fields): DMARC has no one domain to evaluate, so the opt-outs are checked for each, and
   * `dmarc` is the strictest of their own evaluations. Absent otherwise.
   */
  authorDomains?: string[];
  /**
   * More author domains than are evaluated (MAX_AUTHOR_DOMAINS), or a `From:` whose domain the DMARC
   * library cannot read as a reader would: refused as failing DMARC, after the opt-out check.
   */
  unverifiableAuthor?: boolean;
  /**
   * DMARC failed under p=reject and a DNS failure may be why: for the `From:` domain (for each failing
   * one, with several authors), an SPF or DKIM check that could have aligned with it was `temperror`.
   */
  lookupFailed?: boolean;
  dmarc: { result: string; policy: string | null };
  /** A DKIM signature aligned with `From:` passed. */
  alignedDkimPass: boolean;
  /** Our Authentication-Results field's value, starting with the authserv-id, folds as CRLF + space. */
  headerValue: string;
}

export interface AuthenticationRequest {
  /**
   * The message as the sender sent it (headers and body, CRLF), consumed once. When readsBody() said
   * no for its header fields, the header block and the empty line alone are enough.
   */
  message: AsyncIterable<Buffer>;
  clientAddress: string;
  helo: string | null;
  envelopeFrom: string;
}

export interface Authenticator {
  /** DKIM, SPF and DMARC for one message. DNS failures become temperror results, never exceptions. */
  authenticate(request: AuthenticationRequest): Promise<AuthVerdict>;
  /** Whether the verdict for a message with these header field names depends on its body. */
  readsBody(headerNames: readonly string[]): boolean;
}

/** One message, by its key. */
export interface MessageKey {
  inboxId: string;
  messageId: string;
}

/** What one batch freed: messages (or reservations) deleted and the bytes their sizes say. */
export interface Freed {
  messages: number;
  bytes: number;
}

/** How much one statement may do (STYLE 17). */
export interface BatchLimit {
  /** Rows marked or deleted. */
  rows: number;
  /** Sum of `size_bytes` of the messages whose chunks one statement frees (at least one message). */
  bytes: number;
}

/**
 * The physical side of contract section 3's timers, for the jobs (src/jobs). Readers already apply every
 * rule on their own (DESIGN decision 9); these methods only make the rows and chunks go.
 *
 * Every method does one bounded batch and is safe to repeat or to interrupt: each batch commits on its
 * own, re-checks its condition on the rows it changes, and leaves nothing half done. None of them changes
 * what a poll lists or what an inbox's usage counts before the time rules already do, except
 * `recordLost` and `releaseReservations`, which bump the inbox's `version` (see MessageStore).
 * "now" and every cutoff are passed in; nothing reads the database clock.
 */
export interface SweeperStore {
  /**
   * Runs `fn` while this process holds the cluster-wide advisory lock named `job`; when another session
   * holds it, runs nothing and answers `{ ran: false }`. The lock is released when `fn` settles. `lost`
   * is aborted when the lock's session fails while `fn` runs: the lock may be another process's now.
   */
  exclusively<T>(
    job: string,
    fn: (lost: AbortSignal) => Promise<T>,
  ): Promise<{ ran: true; value: T } | { ran: false }>;
  /** PostgreSQL's clock (clock_timestamp()), in milliseconds since the epoch. */
  databaseClockMs(): Promise<number>;
  /**
   * Marks deleted the messages (stored or in flight) of inboxes whose expires_at is before
   * `expiredBefore` (at or before `now`), and frees their chunks. Reason `expired` and deleted_at `now`
   * (after expires_at, so the expired inbox's final counts, read at expires_at, keep them); a message
   * whose delete_after came first keeps that deletion (reason `downloaded` or `unclaimed`, deleted_at =
   * delete_after). The inbox rows are share-locked with their batch: one an extend holds waits for a
   * later batch, and an extend waits for the batch holding its inbox.
   */
  expireMessages(now: Date, expiredBefore: Date, limit: BatchLimit): Promise<Freed>;
  /**
   * Marks deleted the stored messages whose delete_after is at or before `now` (reason `downloaded` if
   * downloaded, else `unclaimed`; deleted_at = delete_after) and frees their chunks.
   */
  deleteDueMessages(now: Date, limit: BatchLimit): Promise<Freed & { downloaded: number; unclaimed: number }>;
  /**
   * Stored messages after `after` in key order, at most `limit`, each with the bytes its chunks hold,
   * read in one snapshot. For finding lost copies; reads only.
   */
  storedCopies(
    after: MessageKey | null,
    limit: number,
  ): Promise<(MessageKey & { sizeBytes: number; storedBytes: number })[]>;
  /** Records a stored message as deleted with reason `lost` and frees what is left of its chunks. */
  recordLost(message: MessageKey, now: Date): Promise<boolean>;
  /**
   * Inboxes due for purge: expired at or before `purgeCutoff`, or cancelled and expired at or before
   * `now` (contract section 3), oldest first.
   */
  inboxesToPurge(now: Date, purgeCutoff: Date, limit: number): Promise<string[]>;
  /**
   * Purges one inbox if it is still due: deletes at most `limit` of its deleted messages, and, once no
   * message is left, the inbox with its credentials, rejections, extend keys and rate buckets.
   * Messages not yet marked deleted are left for expireMessages, which frees their chunks in bounded
   * batches. Returns what it deleted and whether the inbox is gone.
   */
  purgeInbox(
    inboxId: string,
    now: Date,
    purgeCutoff: Date,
    limit: number,
  ): Promise<{ messages: number; purged: boolean; waiting: boolean }>;
  /**
   * Deletes the rows of messages deleted at or before `deletedBefore` (the id then answers 404), in
   * live inboxes only: an expired inbox keeps its rows until its purge, so its final counts hold.
   * A released reservation's row (reason 'released') also stays until the purge: a delivery of its
   * queue id arriving after all (a queue held longer than RESERVATION_TTL_SECONDS) finds it and is
   * dropped, as README says, instead of being stored with no quota check once the row was gone.
   * Any other row stays until its reservation was made at or before `reservedBefore` (Postfix has given
   * up on its queue file): a redelivery of a stored message whose 250 was lost finds it, a duplicate.
   */
  dropTombstones(deletedBefore: Date, reservedBefore: Date, now: Date, limit: number): Promise<number>;
  /** Deletes rejections first listed at or before `listedBefore`. */
  dropRejections(listedBefore: Date, limit: number): Promise<number>;
  /** Deletes provision idempotency records created before `createdBefore` (a replay no longer finds them). */
  forgetProvisions(createdBefore: Date, limit: number): Promise<number>;
  /**
   * Marks deleted (reason `released`, deleted_at `now`) the reservations still in flight that were made
   * at or before `reservedBefore`; the inboxes' usage changes, so their versions are bumped.
   */
  releaseReservations(reservedBefore: Date, now: Date, limit: number): Promise<Freed & { inboxes: number }>;
  /**
   * Looks at the rate buckets after `after` in key order, at most `limit`, and deletes those whose inbox
   * no longer exists or is due for purge. Returns the last key looked at (null at the end of the table).
   */
  dropRateBuckets(
    after: { inboxId: string; bucket: string } | null,
    now: Date,
    purgeCutoff: Date,
    limit: number,
  ): Promise<{ deleted: number; last: { inboxId: string; bucket: string } | null }>;
}
