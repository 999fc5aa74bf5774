/**
 * usage-cache - the last usage (message_count, quota_used_bytes) this process read per inbox, so a
 * status or poll of an unchanged inbox skips the aggregate over its messages.
 *
 * Usage is counted at min(now, expires_at). It changes only by a write that bumps the inbox's
 * `version` (a reservation, a message stored, listed, downloaded, lost or released, a cancellation),
 * or when time passes the earliest delete_after among the counted messages, or the expiry while the
 * inbox is live. An entry is offered only before that instant; the store recomputes whenever the
 * version read with the credential differs from the entry's.
 */
import { BoundedMap } from './bounded-map.ts';
import type { Usage } from './model.ts';

interface Entry {
  version: number;
  usage: Usage;
  validUntil: number;
}

export class UsageCache {
  readonly #entries: BoundedMap<string, Entry>;

  constructor(maxEntries = 20000) {
    this.#entries = new BoundedMap(maxEntries);
  }

  /** The entry for an inbox if time has not moved it; the caller still compares versions. */
  peek(inboxId: string, now: Date): { version: number; usage: Usage } | undefined {
    const entry = this.#entries.get(inboxId);
    if (!entry) return undefined;
    if (now.getTime() < entry.validUntil) return entry;
    this.#entries.delete(inboxId);
    return undefined;
  }

  /**
   * Keeps usage read at `asOf` under `version`. `changesAt` is the earliest delete_after after `asOf`
   * among the counted messages; `expiresAt` bounds a live inbox's entry.
   */
  remember(
    inboxId: string,
    version: number,
    usage: Usage,
    changesAt: Date | null,
    expiresAt: Date,
    asOf: Date,
  ): void {
    let validUntil = changesAt ? changesAt.getTime() : Number.MAX_SAFE_INTEGER;
    if (asOf.getTime() < expiresAt.getTime()) validUntil = Math.min(validUntil, expiresAt.getTime());
    this.#entries.set(inboxId, { version, usage, validUntil });
  }
}
