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
 * new `instance` means the previous transaction is over).
 */
import { addSeconds, type Clock } from './clock.ts';
import { closedInbox, freeBytes } from './inbox-gate.ts';
import type { LifecycleSettings } from './lifecycle.ts';
import { domainOf, inboxIdOf } from './mail-address.ts';
import { OptOuts } from './opt-outs.ts';
import type { DeliveryTarget, InboxStore, MessageStore, ReverseDns } from './ports.ts';
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
  freeBytes: number;
}

export class RecipientAdmission {
  readonly #inboxes: InboxStore;
  readonly #messages: MessageStore;
  readonly #dns: ReverseDns;
  readonly #clock: Clock;
  readonly #replies: SmtpReplies;
  readonly #settings: RecipientSettings;

  constructor(
    inboxes: InboxStore,
    messages: MessageStore,
    dns: ReverseDns,
    clock: Clock,
    replies: SmtpReplies,
    settings: RecipientSettings,
  ) {
    this.#inboxes = inboxes;
    this.#messages = messages;
    this.#dns = dns;
    this.#clock = clock;
    this.#replies = replies;
    this.#settings = settings;
  }

  /** The decisions of one policy connection, with its transaction's recipients. */
  connection(): { decide(request: RecipientRequest): Promise<Verdict> } {
    let instance = '';
    let members: Member[] = [];
    return {
      decide: async (request) => {
        if (request.protocolState === 'CONNECT') return this.admitClient(request.clientAddress, request);
        if (request.protocolState !== 'RCPT') return ACCEPT;
        if (request.instance !== instance) {
          instance = request.instance;
          members = [];
        }
        const outcome = await this.#admitRecipient(request, members);
        if ('member' in outcome) {
          members.push(outcome.member);
          return ACCEPT;
        }
        return outcome.verdict;
      },
    };
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
    const target = inboxId
      ? await this.#inboxes.findForDelivery(
          inboxId,
          now,
          senderDomain ? OptOuts.namesCovering(senderDomain) : [],
        )
      : undefined;
    const closed = closedInbox(target?.inbox, now, this.#replies, this.#settings);
    if (closed || !target) return { verdict: closed ?? this.#replies.noSuchInbox };

    const optedOut = senderDomain ? OptOuts.covering(senderDomain, target.optedOut) : null;
    if (optedOut) {
      await this.#record(target, request, 'sender_opted_out', optedOut, now);
      return { verdict: this.#replies.senderOptedOut };
    }
    const free = freeBytes(target);
    if (request.size > free) {
      await this.#record(target, request, 'quota', null, now);
      return { verdict: this.#replies.quotaExceeded };
    }
    const member: Member = {
      inboxId: target.inbox.inboxId,
      senderDomains: target.inbox.senderDomains.join(','),
      freeBytes: free,
    };
    const first = members[0];
    if (first && !this.#sameVerdict(first, member)) return { verdict: this.#replies.separateTransaction };
    return { member };
  }

  /**
   * Two recipients get the same end-of-data verdict for any message when their allowlists are equal
   * and neither can run out of quota for a message of the largest size (opt-outs and DMARC are global).
   */
  #sameVerdict(a: Member, b: Member): boolean {
    const max = this.#settings.maxMessageBytes;
    return a.senderDomains === b.senderDomains && a.freeBytes >= max && b.freeBytes >= max;
  }

  async #record(
    target: DeliveryTarget,
    request: RecipientRequest,
    reason: 'sender_opted_out' | 'quota',
    senderDomain: string | null,
    now: Date,
  ): Promise<void> {
    await this.#messages.recordRejection(
      {
        inboxId: target.inbox.inboxId,
        reason,
        envelopeFrom: request.sender,
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
