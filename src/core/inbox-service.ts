/**
 * inbox-service - provision, status, extend, sender domains and cancellation (contract sections 3-5).
 *
 * Paid calls are idempotent per contract section 5.7: provision keys live IDEMPOTENCY_TTL_SECONDS and
 * their stored response is sealed under the key (DESIGN decision 10); extend keys are scoped to the inbox.
 */
import { addSeconds, type Clock } from './clock.ts';
import { inboxCancelled, ServiceError, unauthorized } from './errors.ts';
import { newInboxId, newOwnerCredential, newReaderCredential } from './ids.ts';
import { type InboxStatus, presentInboxStatus } from './inbox-status.ts';
import { usageInstant } from './lifecycle.ts';
import type { Caller, InboxRecord, Usage } from './model.ts';
import type { OptOuts } from './opt-outs.ts';
import type { InboxStore } from './ports.ts';
import { hashCredential, type Secrets } from './secrets.ts';

export interface InboxSettings {
  provisioning: 'open' | 'closed';
  mailDomain: string;
  unitSeconds: number;
  quotaBytes: number;
  idempotencyTtlSeconds: number;
}

export interface ProvisionedInbox {
  inbox_id: string;
  address: string;
  created_at: string;
  expires_at: string;
  quota_bytes: number;
  sender_domains: string[];
  credentials: { owner: string; reader: string };
}

export interface Replayable<T> {
  body: T;
  replayed: boolean;
}

export class InboxService {
  readonly #store: InboxStore;
  readonly #optOuts: OptOuts;
  readonly #secrets: Secrets;
  readonly #clock: Clock;
  readonly #settings: InboxSettings;

  constructor(store: InboxStore, optOuts: OptOuts, secrets: Secrets, clock: Clock, settings: InboxSettings) {
    this.#store = store;
    this.#optOuts = optOuts;
    this.#secrets = secrets;
    this.#clock = clock;
    this.#settings = settings;
  }

  /** The HTTP route's gate: 401 while provisioning is closed. The operator CLI provisions regardless. */
  assertProvisioningOpen(): void {
    if (this.#settings.provisioning === 'closed') throw unauthorized();
  }

  async provision(senderDomains: string[], idempotencyKey?: string): Promise<Replayable<ProvisionedInbox>> {
    try {
      await this.#optOuts.assertAllowed(senderDomains);
    } catch (refused) {
      // A retry of a provision that succeeded before a domain opted out still gets its stored response
      // (contract 5.7: a replay returns the original response and charges nothing).
      const replay =
        idempotencyKey === undefined ? undefined : await this.#replay(senderDomains, idempotencyKey);
      if (replay) return replay;
      throw refused;
    }
    const now = this.#clock.now();
    const owner = newOwnerCredential();
    const reader = newReaderCredential();
    const inbox = {
      inboxId: newInboxId(),
      createdAt: now,
      expiresAt: addSeconds(now, this.#settings.unitSeconds),
      quotaBytes: this.#settings.quotaBytes,
      senderDomains,
    };
    const body: ProvisionedInbox = {
      inbox_id: inbox.inboxId,
      address: `${inbox.inboxId}@${this.#settings.mailDomain}`,
      created_at: inbox.createdAt.toISOString(),
      expires_at: inbox.expiresAt.toISOString(),
      quota_bytes: inbox.quotaBytes,
      sender_domains: senderDomains,
      credentials: { owner, reader },
    };
    const record = { ...inbox, ownerHash: hashCredential(owner), readerHash: hashCredential(reader) };
    if (idempotencyKey === undefined) {
      await this.#store.create(record);
      return { body, replayed: false };
    }
    const requestHash = this.#secrets.requestHash({ sender_domains: senderDomains });
    const result = await this.#store.create(record, {
      keyHash: this.#secrets.idempotencyKeyHash('provision', idempotencyKey),
      requestHash,
      sealedResponse: this.#secrets.seal(idempotencyKey, JSON.stringify(body)),
      forgetBefore: addSeconds(now, -this.#settings.idempotencyTtlSeconds),
      now,
    });
    if (result.created) return { body, replayed: false };
    if (!result.existing.requestHash.equals(requestHash)) throw idempotencyConflict();
    const stored = JSON.parse(
      this.#secrets.open(idempotencyKey, result.existing.sealedResponse),
    ) as ProvisionedInbox;
    return { body: stored, replayed: true };
  }

  /** The stored response for this key and request, if the key is still remembered. */
  async #replay(senderDomains: string[], key: string): Promise<Replayable<ProvisionedInbox> | undefined> {
    const existing = await this.#store.findProvision(
      this.#secrets.idempotencyKeyHash('provision', key),
      addSeconds(this.#clock.now(), -this.#settings.idempotencyTtlSeconds),
    );
    if (!existing?.requestHash.equals(this.#secrets.requestHash({ sender_domains: senderDomains })))
      return undefined;
    return {
      body: JSON.parse(this.#secrets.open(key, existing.sealedResponse)) as ProvisionedInbox,
      replayed: true,
    };
  }

  /** `usage` when the caller already has it (read with the credential, at usageInstant). */
  async status(inbox: InboxRecord, known?: Usage): Promise<InboxStatus> {
    const now = this.#clock.now();
    const usage = known ?? (await this.#store.usage(inbox.inboxId, usageInstant(inbox, now)));
    return presentInboxStatus(inbox, usage, now, this.#settings.mailDomain);
  }

  async extend(caller: Caller, idempotencyKey?: string): Promise<Replayable<InboxStatus>> {
    const keyHash =
      idempotencyKey === undefined
        ? undefined
        : this.#secrets.idempotencyKeyHash(caller.inbox.inboxId, idempotencyKey);
    const result = await this.#store.extend(
      caller.inbox.inboxId,
      this.#settings.unitSeconds,
      () => this.#clock.now(),
      keyHash,
      (inbox, usage, now) => presentInboxStatus(inbox, usage, now, this.#settings.mailDomain),
    );
    if (result.kind === 'expired') throw inboxExpired();
    if (result.kind === 'cancelled') throw inboxCancelled(result.cancelledAt);
    return { body: result.response as InboxStatus, replayed: result.kind === 'replayed' };
  }

  /** The opt-out check (a 409 that depends on the request alone) is the caller's, before authorization. */
  async setSenderDomains(caller: Caller, senderDomains: string[]): Promise<InboxStatus> {
    const now = this.#clock.now();
    const updated = await this.#store.setSenderDomains(caller.inbox.inboxId, senderDomains, now);
    if (updated.kind === 'expired') throw inboxExpired();
    if (updated.kind === 'cancelled') throw inboxCancelled(updated.cancelledAt);
    return this.status(updated.inbox);
  }

  /**
   * Operator action: cancel for abuse. A live inbox is cancelled; one cancelled before is
   * `already_cancelled` and keeps its first cancellation's time (the store's coalesce); an expired one
   * is left as it is (until 2026-11-25 cancelling it purged it at once, taking the agent's final view).
   */
  async cancel(inboxId: string): Promise<'cancelled' | 'already_cancelled' | 'expired' | 'not_found'> {
    const now = this.#clock.now();
    const cancelled = await this.#store.cancel(inboxId, now);
    if (cancelled)
      return cancelled.cancelledAt?.getTime() === now.getTime() ? 'cancelled' : 'already_cancelled';
    return (await this.#store.find(inboxId)) ? 'expired' : 'not_found';
  }
}

const idempotencyConflict = (): ServiceError =>
  new ServiceError(
    'idempotency_conflict',
    'This Idempotency-Key was already used with a different request.',
    {
      field: 'Idempotency-Key',
    },
  );

const inboxExpired = (): ServiceError => new ServiceError('inbox_expired', 'This inbox has expired.');
