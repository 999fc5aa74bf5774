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
import { isExpired, usageInstant } from './lifecycle.ts';
import type { Caller, MessageRecord, RejectionRecord } from './model.ts';
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
  messages: MessageSummary[];
  rejections: RejectionEvent[];
  next_cursor: string;
  next_url: string;
  has_more: boolean;
}

export class PollService {
  readonly #messages: MessageStore;
  readonly #clock: Clock;
  readonly #settings: PollSettings;

  constructor(messages: MessageStore, clock: Clock, settings: PollSettings) {
    this.#messages = messages;
    this.#clock = clock;
    this.#settings = settings;
  }

  /** `afterPosition` is a decoded cursor (0 without one); a position past the sequence was never issued. */
  async poll(caller: Caller, afterPosition: number, limit: number): Promise<PollResponse> {
    const { inbox } = caller;
    if (afterPosition > inbox.eventSeq)
      throw invalidRequest('cursor', 'This cursor was not issued by the service.');
    const now = this.#clock.now();
    const { events, usage } = await this.#messages.listEvents(inbox.inboxId, {
      afterPosition,
      limit,
      now,
      includeMessages: !isExpired(inbox, now),
      rejectionsListedAfter: addSeconds(now, -this.#settings.rejectionRetentionSeconds),
      usageAsOf: usageInstant(inbox, now),
    });
    const page = events.slice(0, limit);
    const hasMore = events.length > limit;
    const last = page[page.length - 1];
    const nextPosition = hasMore && last ? last.position : Math.max(inbox.eventSeq, last?.position ?? 0);

    const messages: MessageRecord[] = [];
    const rejections: RejectionRecord[] = [];
    const unlistedRejections: number[] = [];
    for (const event of page) {
      if (event.kind === 'message') messages.push(event.message);
      else {
        rejections.push(event.rejection);
        if (event.listedAt === null) unlistedRejections.push(event.position);
      }
    }
    const unlisted = messages.filter((m) => m.listedAt === null).map((m) => m.messageId);
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

    const inboxUrl = `${this.#settings.publicBaseUrl}/v1/inboxes/${inbox.inboxId}`;
    const nextCursor = encodeCursor(nextPosition);
    return {
      inbox: presentInboxStatus(inbox, usage, now, this.#settings.mailDomain),
      server_time: now.toISOString(),
      messages: messages.map((m) =>
        presentMessage(m, inboxUrl, listed.get(m.messageId) ?? m.deleteAfter ?? now),
      ),
      rejections: rejections.map(presentRejection),
      next_cursor: nextCursor,
      next_url: `${inboxUrl}/messages?cursor=${nextCursor}&limit=${limit}`,
      has_more: hasMore,
    };
  }
}

function presentMessage(m: MessageRecord, inboxUrl: string, deleteAfter: Date): MessageSummary {
  return {
    message_id: m.messageId,
    url: `${inboxUrl}/messages/${m.messageId}`,
    from: { name: m.fromName, address: m.fromAddress ?? (m.envelopeFrom === '' ? null : m.envelopeFrom) },
    envelope_from: m.envelopeFrom,
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
  envelope_from: r.envelopeFrom,
  reason: r.reason,
  sender_domain: r.senderDomain,
  size_bytes: r.sizeBytes,
});
