/**
 * poll-service - GET /v1/inboxes/{id}/messages (contract section 4, poll rules 1-7).
 *
 * The cursor is a position in the inbox's event sequence (DESIGN decision 8). The next cursor is the
 * last event returned when there is more, else the highest position known to be committed before the
 * listing was read, so a poller following next_url neither skips nor repeats an event.
 */
import { addSeconds, type Clock } from './clock.ts';
import { encodeCursor } from './cursor.ts';
import { invalidRequest } from './errors.ts';
import { type InboxStatus, presentInboxStatus } from './inbox-status.ts';
import { isExpired } from './lifecycle.ts';
import { printable } from './message-summary.ts';
import type { Caller, MessageRecord, RejectionRecord, Usage } from './model.ts';
import { type CachedPage, PollCache } from './poll-cache.ts';
import type { MessageStore } from './ports.ts';

export interface PollSettings {
  mailDomain: string;
  publicBaseUrl: string;
  unclaimedSeconds: number;
  rejectionRetentionSeconds: number;
}

export interface MessageSummary {
  message_id: string;
  url: string;
  from: { name: string | null; address: string | null };
  envelope_from: string;
  subject: string | null;
  size_bytes: number;
  received_at: string;
  downloaded_at: string | null;
  delete_after: string;
  internet_message_id: string | null;
  authentication: MessageRecord['authentication'];
}

export interface RejectionEvent {
  at: string;
  envelope_from: string;
  reason: string;
  sender_domain: string | null;
  size_bytes: number;
}

export interface PollResponse {
  inbox: InboxStatus;
  server_time: string;
  messages: readonly MessageSummary[];
  rejections: readonly RejectionEvent[];
  next_cursor: string;
  next_url: string;
  has_more: boolean;
}

export class PollService {
  readonly #messages: MessageStore;
  readonly #clock: Clock;
  readonly #settings: PollSettings;
  readonly #cache: PollCache;

  constructor(messages: MessageStore, clock: Clock, settings: PollSettings, cache = new PollCache()) {
    this.#messages = messages;
    this.#cache = cache;
    this.#clock = clock;
    this.#settings = settings;
  }

  /**
   * `afterPosition` is a decoded cursor (0 without one); a position past the sequence was never issued.
   * `usage` comes with the credential lookup (Operation.withUsage).
   */
  async poll(caller: Caller, afterPosition: number, limit: number, usage: Usage): Promise<PollResponse> {
    const { inbox } = caller;
    if (afterPosition > inbox.eventSeq)
      throw invalidRequest('cursor', 'This cursor was not issued by the service.');
    const now = this.#clock.now();
    const key = PollCache.key(inbox.inboxId, afterPosition, limit);
    const page =
      this.#cache.get(key, inbox.version, now) ??
      (await this.#readPage(caller, afterPosition, limit, now, key));
    const inboxUrl = `${this.#settings.publicBaseUrl}/v1/inboxes/${inbox.inboxId}`;
    const nextCursor = encodeCursor(page.nextPosition);
    // The status was read with the credential, the events a moment later: a rejection recorded in
    // between is listed, so it is counted too (each recorded event counts at least one attempt).
    // Until 2026-11-25 such a poll could show fewer attempts than the rejections it listed.
    const newer = page.rejectionPositions.filter((position) => position > inbox.eventSeq).length;
    const counted = newer === 0 ? inbox : { ...inbox, rejectionCount: inbox.rejectionCount + newer };
    return {
      inbox: presentInboxStatus(counted, usage, now, this.#settings.mailDomain),
      server_time: now.toISOString(),
      messages: page.messages,
      rejections: page.rejections,
      next_cursor: nextCursor,
      next_url: `${inboxUrl}/messages?cursor=${nextCursor}&limit=${limit}`,
      has_more: page.hasMore,
    };
  }

  async #readPage(
    caller: Caller,
    afterPosition: number,
    limit: number,
    now: Date,
    key: string,
  ): Promise<CachedPage> {
    const { inbox } = caller;
    const retentionMs = this.#settings.rejectionRetentionSeconds * 1000;
    const events = await this.#messages.listEvents(inbox.inboxId, {
      afterPosition,
      limit,
      now,
      includeMessages: !isExpired(inbox, now),
      rejectionsListedAfter: new Date(now.getTime() - retentionMs),
    });
    const slice = events.slice(0, limit);
    const hasMore = events.length > limit;
    const last = slice[slice.length - 1];
    const nextPosition = hasMore && last ? last.position : Math.max(inbox.eventSeq, last?.position ?? 0);

    const messages: MessageRecord[] = [];
    const rejections: { rejection: RejectionRecord; listedAt: Date | null }[] = [];
    for (const event of slice) {
      if (event.kind === 'message') messages.push(event.message);
      else rejections.push({ rejection: event.rejection, listedAt: event.listedAt });
    }
    const unlisted = messages.filter((m) => m.listedAt === null).map((m) => m.messageId);
    const unlistedRejections = rejections.filter((r) => r.listedAt === null).map((r) => r.rejection.position);
    const listed =
      unlisted.length > 0
        ? await this.#messages.markListed(
            inbox.inboxId,
            unlisted,
            now,
            addSeconds(now, this.#settings.unclaimedSeconds),
          )
        : new Map<string, Date>();
    if (unlistedRejections.length > 0)
      await this.#messages.markRejectionsListed(inbox.inboxId, unlistedRejections, now);

    // A message listed concurrently by another poll got the same timer, give or take that poll's clock.
    const deleteAfter = (m: MessageRecord) =>
      listed.get(m.messageId) ?? m.deleteAfter ?? addSeconds(now, this.#settings.unclaimedSeconds);
    const inboxUrl = `${this.#settings.publicBaseUrl}/v1/inboxes/${inbox.inboxId}`;
    // Expiry empties the message list; once expired, only the rejections' retention moves anything.
    let validUntil = isExpired(inbox, now) ? Number.MAX_SAFE_INTEGER : inbox.expiresAt.getTime();
    for (const m of messages) validUntil = Math.min(validUntil, deleteAfter(m).getTime());
    for (const r of rejections)
      validUntil = Math.min(validUntil, (r.listedAt ?? now).getTime() + retentionMs);
    // `hasMore` rests on the events beyond the page: their deadlines end the page's validity too, or a
    // page kept saying `has_more: true` after the last of them was deleted (until 2026-11-25).
    for (const event of events.slice(limit)) {
      const ends =
        event.kind === 'message'
          ? event.message.deleteAfter?.getTime()
          : event.listedAt && event.listedAt.getTime() + retentionMs;
      if (ends) validUntil = Math.min(validUntil, ends);
    }
    const page: CachedPage = {
      version: inbox.version,
      validUntil,
      messages: messages.map((m) => presentMessage(m, inboxUrl, deleteAfter(m))),
      rejections: rejections.map((r) => presentRejection(r.rejection)),
      rejectionPositions: rejections.map((r) => r.rejection.position),
      nextPosition,
      hasMore,
    };
    if (unlisted.length === 0 && unlistedRejections.length === 0) this.#cache.set(key, page);
    return page;
  }
}

function presentMessage(m: MessageRecord, inboxUrl: string, deleteAfter: Date): MessageSummary {
  return {
    message_id: m.messageId,
    url: `${inboxUrl}/messages/${m.messageId}`,
    // The envelope sender stands in only for a missing From: (message-summary.ts, at delivery).
    from: { name: m.fromName, address: m.fromAddress },
    // Postfix takes an ESC or DEL inside MAIL FROM; what is stored stays as sent (idempotency,
    // rejection merging), what the agent reads is text, as the summary fields are.
    envelope_from: printable(m.envelopeFrom),
    subject: m.subject,
    size_bytes: m.sizeBytes,
    received_at: (m.receivedAt ?? deleteAfter).toISOString(),
    downloaded_at: m.downloadedAt ? m.downloadedAt.toISOString() : null,
    delete_after: deleteAfter.toISOString(),
    internet_message_id: m.internetMessageId,
    authentication: m.authentication,
  };
}

const presentRejection = (r: RejectionRecord): RejectionEvent => ({
  at: r.at.toISOString(),
  envelope_from: printable(r.envelopeFrom),
  reason: r.reason,
  sender_domain: r.senderDomain,
  size_bytes: r.sizeBytes,
});
