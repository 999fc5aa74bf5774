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

/** What all kept pages may hold together, by pageBytes(). */
export const POLL_CACHE_BYTES = 64 * 1024 * 1024;
/** At most this part of the budget per page: a larger page is read again each time, not kept. */
const PAGE_SHARE = 16;

/**
 * A page's memory, generously: every character of its strings counted four times (two bytes in the
 * summary objects, two more in the JSON copy http/poll-body.ts keeps), plus some bytes per value. A
 * summary may hold some 16,000 characters (MAX_FIELD_CHARS per field) and a page 200 summaries: counted
 * in pages alone, 2,000 such pages (a sender filling one inbox, polled with distinct cursors and limits)
 * were gigabytes, and ran the API out of heap.
 */
export function pageBytes(page: Pick<CachedPage, 'messages' | 'rejections'>): number {
  return 4 * (size(page.messages) + size(page.rejections));
}

function size(value: unknown): number {
  if (typeof value === 'string') return value.length + 8;
  if (value === null || typeof value !== 'object') return 8;
  let total = 16;
  for (const member of Array.isArray(value) ? value : Object.values(value)) total += 8 + size(member);
  return total;
}

export class PollCache {
  /** In the order they were set: the first is the oldest. */
  readonly #pages = new Map<string, { page: CachedPage; bytes: number }>();
  readonly #maxPages: number;
  readonly #maxBytes: number;
  #bytes = 0;

  /** At most `maxPages` pages and `maxBytes` (pageBytes) in all, the oldest dropped first. */
  constructor(maxPages = 2000, maxBytes = POLL_CACHE_BYTES) {
    this.#maxPages = maxPages;
    this.#maxBytes = maxBytes;
  }

  static key(inboxId: string, afterPosition: number, limit: number): string {
    return `${inboxId}/${afterPosition}/${limit}`;
  }

  /** What the kept pages hold, by pageBytes(). */
  get bytes(): number {
    return this.#bytes;
  }

  get size(): number {
    return this.#pages.size;
  }

  get(key: string, version: number, now: Date): CachedPage | undefined {
    const entry = this.#pages.get(key);
    if (!entry) return undefined;
    if (entry.page.version === version && now.getTime() < entry.page.validUntil) return entry.page;
    this.#drop(key);
    return undefined;
  }

  set(key: string, page: CachedPage): void {
    this.#drop(key);
    const bytes = pageBytes(page);
    if (this.#maxPages === 0 || bytes > this.#maxBytes / PAGE_SHARE) return;
    while (this.#pages.size >= this.#maxPages || this.#bytes + bytes > this.#maxBytes) {
      const oldest = this.#pages.keys().next().value;
      if (oldest === undefined) break;
      this.#drop(oldest);
    }
    // Frozen: every poll served from this page shares these arrays (and http/poll-body.ts their JSON).
    Object.freeze(page.messages);
    Object.freeze(page.rejections);
    this.#pages.set(key, { page, bytes });
    this.#bytes += bytes;
  }

  #drop(key: string): void {
    const entry = this.#pages.get(key);
    if (!entry) return;
    this.#pages.delete(key);
    this.#bytes -= entry.bytes;
  }
}
