/**
 * recipient-admission - the policy daemon's decisions (DESIGN decision 2, rows decided at CONNECT and
 * RCPT; decision 3, one verdict per transaction).
 *
 * CONNECT: a client address without any PTR record is refused (550); a PTR lookup that times out or
 * fails is a 450, because Postfix's `reverse_client_name=unknown` cannot tell the two apart
 * (MAIL-FACTS A.6), so we ask DNS ourselves.
 * RCPT, in order: no such inbox (or purged), cancelled, expired, envelope sender's domain opted out
 * (recorded), declared SIZE= over the free quota (recorded), then the grouping rule: a further
 * recipient joins the transaction only if its end-of-data verdict is necessarily the first one's.
 *
 * One RecipientAdmission serves every connection; `connection()` holds the per-transaction state of
 * one Postfix policy connection (Postfix sends one transaction's requests over one connection, and a
 * new `instance` means the previous transaction is over). That state is kept by `instance` across
 * connections too: smtpd may close its policy connection between two RCPTs of one transaction
 * (smtpd_policy_service_max_ttl, or our disconnect on trouble) and go on over a new one.
 */
import { BoundedMap } from './bounded-map.ts';
import { addSeconds, type Clock } from './clock.ts';
import { closedInbox, freeBytes } from './inbox-gate.ts';
import type { LifecycleSettings } from './lifecycle.ts';
import { domainOf, inboxIdOf, quotedAddress } from './mail-address.ts';
import { MAX_ADDED_BYTES } from './message-admission.ts';
import type { InboxSettings } from './model.ts';
import { OptOuts } from './opt-outs.ts';
import type { InboxStore, MessageStore, RecipientLookup, RecipientTarget, ReverseDns } from './ports.ts';
import type { SmtpReplies } from './smtp-replies.ts';
import { ACCEPT, type Verdict } from './verdict.ts';

export interface RecipientRequest {
  protocolState: string;
  instance: string;
  clientAddress: string;
  reverseClientName: string;
  sender: string;
  recipient: string;
  /** The SIZE= the client declared at MAIL, 0 when none. */
  size: number;
}

export interface RecipientSettings extends LifecycleSettings {
  mailDomain: string;
  requirePtr: boolean;
  maxMessageBytes: number;
  maxRejections: number;
  rejectionRetentionSeconds: number;
}

/** What decides a recipient's end-of-data verdict besides the message itself. */
interface Member {
  inboxId: string;
  senderDomains: string;
  /** Null until a decision needed it (see #sameVerdict). */
  freeBytes: number | null;
}

/** One transaction's recipients so far, and the verdict each inbox got. */
interface Transaction {
  instance: string;
  members: Member[];
  /** Each inbox's verdict, as soon as it is being decided: a retry of the RCPT waits for it. */
  decided: Map<string, Promise<Verdict>>;
}

/**
 * Transactions kept by `instance` beyond their connection: one per smtpd process in a transaction
 * (default_process_limit, 100) plus those whose connection closed after its last one, dropped oldest first.
 */
const MAX_OPEN_TRANSACTIONS = 4096;

export class RecipientAdmission {
  readonly #transactions = new BoundedMap<string, Transaction>(MAX_OPEN_TRANSACTIONS);
  readonly #inboxes: InboxStore;
  readonly #lookup: RecipientLookup;
  readonly #messages: MessageStore;
  readonly #dns: ReverseDns;
  readonly #clock: Clock;
  readonly #replies: SmtpReplies;
  readonly #settings: RecipientSettings;

  constructor(
    inboxes: InboxStore,
    lookup: RecipientLookup,
    messages: MessageStore,
    dns: ReverseDns,
    clock: Clock,
    replies: SmtpReplies,
    settings: RecipientSettings,
  ) {
    this.#inboxes = inboxes;
    this.#lookup = lookup;
    this.#messages = messages;
    this.#dns = dns;
    this.#clock = clock;
    this.#replies = replies;
    this.#settings = settings;
  }

  /**
   * The decisions of one policy connection, with its transaction's recipients. An inbox named again in
   * the same transaction (the same address, or another spelling of it) gets the verdict it got, with
   * nothing recorded again: until 2026-11-25 a repeat was grouped as another inbox (452 4.5.3 when its
   * quota was not roomy), and a refusal was recorded once per repeat.
   */
  connection(): { decide(request: RecipientRequest): Promise<Verdict> } {
    let current: Transaction = { instance: '', members: [], decided: new Map() };
    return {
      decide: async (request) => {
        if (request.protocolState === 'CONNECT') return this.admitClient(request.clientAddress, request);
        if (request.protocolState !== 'RCPT') return ACCEPT;
        if (request.instance !== current.instance) current = this.#transaction(current, request.instance);
        const { members, decided } = current;
        const inboxId = inboxIdOf(request.recipient, this.#settings.mailDomain);
        // Kept before it is decided: Postfix sends the same RCPT again (same instance, a new
        // connection) when this one took too long, and deciding it twice recorded its refusal twice.
        const decide = (): Promise<Verdict> => {
          const deciding = this.#admitRecipient(request, members).then((outcome) => {
            if ('member' in outcome) members.push(outcome.member);
            return 'member' in outcome ? ACCEPT : outcome.verdict;
          });
          if (inboxId !== null) {
            decided.set(inboxId, deciding);
            // A decision that failed (PostgreSQL away) is not kept.
            deciding.catch(() => {
              if (decided.get(inboxId) === deciding) decided.delete(inboxId);
            });
          }
          return deciding;
        };
        const earlier = inboxId === null ? undefined : decided.get(inboxId);
        // A retry waits for the decision in progress; should that fail, it decides again.
        return earlier ? earlier.catch(decide) : decide();
      },
    };
  }

  /**
   * The transaction a connection moves on to: the one this `instance` began on an earlier connection,
   * or a new one. The one it leaves is over (its smtpd went on to another transaction). Without an
   * `instance` (not Postfix) a transaction stays with its connection.
   */
  #transaction(left: Transaction, instance: string): Transaction {
    if (left.instance) this.#transactions.delete(left.instance);
    if (!instance) return { instance, members: [], decided: new Map() };
    const next = this.#transactions.get(instance) ?? { instance, members: [], decided: new Map() };
    this.#transactions.set(instance, next);
    return next;
  }

  async admitClient(address: string, request: { reverseClientName: string }): Promise<Verdict> {
    if (!this.#settings.requirePtr) return ACCEPT;
    if (request.reverseClientName && request.reverseClientName !== 'unknown') return ACCEPT;
    const found = await this.#dns.lookup(address);
    if (found === 'found') return ACCEPT;
    return found === 'none' ? this.#replies.noReverseDns : this.#replies.reverseDnsUnavailable;
  }

  async #admitRecipient(
    request: RecipientRequest,
    members: Member[],
  ): Promise<{ member: Member } | { verdict: Verdict }> {
    const now = this.#clock.now();
    const inboxId = inboxIdOf(request.recipient, this.#settings.mailDomain);
    const senderDomain = domainOf(request.sender);
    const names = senderDomain ? OptOuts.namesCovering(senderDomain) : [];
    const first = members[0];
    // Usage is read, fresh, only when a decision needs it: a declared SIZE=, or a further recipient (the
    // grouping rule compares free quota). A first recipient without SIZE= needs the inbox's settings
    // and the opt-outs alone, which the lookup may answer from memory.
    const withUsage = request.size > 0 || first !== undefined;
    let target: (RecipientTarget & { usedBytes?: number }) | undefined = !inboxId
      ? undefined
      : withUsage
        ? await this.#inboxes.findForDelivery(inboxId, now, names)
        : await this.#lookup.find(inboxId, names);
    // Not refused from memory for what a change could have undone: what it kept can be up to its
    // recheck (35 s) behind a change it was not told of (an extend, an opt-out removed), and these
    // refusals are for good. Read again. (An inbox not found was read just now, the lookup keeps none;
    // a cancel or a purge is never undone.)
    const refuses = (t: RecipientTarget | undefined) =>
      t !== undefined &&
      (closedInbox(t.inbox, now, this.#replies, this.#settings) === this.#replies.inboxExpired ||
        (senderDomain !== null && OptOuts.covering(senderDomain, t.optedOut) !== null));
    if (inboxId && !withUsage && refuses(target))
      target = await this.#inboxes.findForDelivery(inboxId, now, names);
    const closed = closedInbox(target?.inbox, now, this.#replies, this.#settings);
    if (closed || !target) return { verdict: closed ?? this.#replies.noSuchInbox };

    const optedOut = senderDomain ? OptOuts.covering(senderDomain, target.optedOut) : null;
    if (optedOut) {
      await this.#record(target.inbox, request, 'sender_opted_out', optedOut, now);
      return { verdict: this.#replies.senderOptedOut };
    }
    // A declared size over the limit is left to end of data, which refuses it with 552 5.3.4 and records
    // nothing: the size limit comes before the quota there (message-admission.ts). Until 2026-11-25
    // such a SIZE=, over the free quota too, was recorded as `quota`, and the same message sent without
    // SIZE= was not. Not refused here: a 552 to RCPT is "too many recipients" to some clients (RFC 5321
    // 4.5.3.1.10), which retry it; and Postfix itself refuses at MAIL what is over its own limit, 64 KiB
    // more, so what comes here is at most that much over.
    const { usedBytes } = target;
    const free = usedBytes === undefined ? null : freeBytes({ inbox: target.inbox, usedBytes });
    if (free !== null && request.size > free && request.size <= this.#settings.maxMessageBytes) {
      await this.#record(target.inbox, request, 'quota', null, now);
      return { verdict: this.#replies.quotaExceeded };
    }
    const member: Member = {
      inboxId: target.inbox.inboxId,
      senderDomains: target.inbox.senderDomains.join(','),
      freeBytes: free,
    };
    if (first && !(await this.#sameVerdict(first, member, now)))
      return { verdict: this.#replies.separateTransaction };
    return { member };
  }

  /**
   * Two recipients get the same end-of-data verdict for any message when their allowlists are equal
   * and neither can run out of quota for a message of the largest size (opt-outs and DMARC are global).
   * "Run out" counts what the milter reserves beyond the message (MAX_ADDED_BYTES): with the bare
   * maximum, an inbox with room for the message but not for its reservation was grouped, and the pair
   * got 451 4.5.3 on every retry (until 2026-11-25). The first recipient's free quota is read now if
   * its RCPT did not need it.
   */
  async #sameVerdict(first: Member, next: Member, now: Date): Promise<boolean> {
    if (first.senderDomains !== next.senderDomains) return false;
    if (first.freeBytes === null) {
      const target = await this.#inboxes.findForDelivery(first.inboxId, now);
      first.freeBytes = target ? freeBytes(target) : 0;
    }
    const max = this.#settings.maxMessageBytes + MAX_ADDED_BYTES;
    return first.freeBytes >= max && (next.freeBytes ?? 0) >= max;
  }

  async #record(
    inbox: InboxSettings,
    request: RecipientRequest,
    reason: 'sender_opted_out' | 'quota',
    senderDomain: string | null,
    now: Date,
  ): Promise<void> {
    await this.#messages.recordRejection(
      {
        inboxId: inbox.inboxId,
        reason,
        envelopeFrom: quotedAddress(request.sender),
        senderDomain,
        sizeBytes: request.size,
        internetMessageId: null,
        now,
      },
      this.#settings.maxRejections,
      addSeconds(now, -this.#settings.rejectionRetentionSeconds),
    );
  }
}
