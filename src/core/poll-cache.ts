/**
 * poll-cache - recent poll pages of this process, so an inbox polled again with nothing changed costs
 * no listing query.
 *
 * A page is served again only while both hold:
 * - the inbox's `version` is the one the page was read under: every write that can change what a poll
 *   lists (a message stored, listed, downloaded or lost, a rejection recorded or listed, a
 *   cancellation) bumps it, in the same transaction, whatever process makes it;
 * - no time rule has moved: the page is valid until the earliest delete_after among its messages, the
 *   end of retention of its rejections, and the inbox's expiry.
 * A page whose poll wrote something (a first listing) is not kept: its version stamp would be unknown.
 * Usage and the inbox status are never cached; they come with the credential lookup.
 */
import { BoundedMap } from './bounded-map.ts';
import type { MessageSummary, RejectionEvent } from './poll-service.ts';

export interface CachedPage {
  version: number;
  /** Epoch milliseconds; the page is stale from this instant on. */
  validUntil: number;
  messages: readonly MessageSummary[];
  rejections: readonly RejectionEvent[];
  /** The event positions of `rejections`, in order. */
  rejectionPositions: readonly number[];
  nextPosition: number;
  hasMore: boolean;
}

export class PollCache {
  readonly #pages: BoundedMap<string, CachedPage>;

  /** At most `maxPages` pages (a 20-message page is about 10 KB), the oldest dropped first. */
  constructor(maxPages = 2000) {
    this.#pages = new BoundedMap(maxPages);
  }

  static key(inboxId: string, afterPosition: number, limit: number): string {
    return `${inboxId}/${afterPosition}/${limit}`;
  }

  get(key: string, version: number, now: Date): CachedPage | undefined {
    const page = this.#pages.get(key);
    if (!page) return undefined;
    if (page.version === version && now.getTime() < page.validUntil) return page;
    this.#pages.delete(key);
    return undefined;
  }

  set(key: string, page: CachedPage): void {
    // Frozen: every poll served from this page shares these arrays (and http/poll-body.ts their JSON).
    Object.freeze(page.messages);
    Object.freeze(page.rejections);
    this.#pages.set(key, page);
  }
}
