/**
 * message-admission - the milter's end-of-data decisions (DESIGN decision 2, rows decided at EOM;
 * decisions 3, 4 and 6).
 *
 * In order: over the size limit (552, not recorded); DMARC failed under `p=reject` (550, not recorded);
 * `From:` domain opted out (555, recorded); then per recipient: the inbox closed meanwhile, not admitted
 * by its `sender_domains` (451, recorded once per Message-ID), over its free quota (555, recorded). SMTP
 * has one reply after DATA, so the recipients' verdicts must agree; if they do not (a race since RCPT),
 * the whole message gets a 4xx and nothing is recorded. When all accept, the message is reserved in
 * every inbox in one transaction with the quota check (decision 4).
 */
import { addSeconds, type Clock } from './clock.ts';
import { newMessageId } from './ids.ts';
import { closedInbox } from './inbox-gate.ts';
import type { LifecycleSettings } from './lifecycle.ts';
import { inboxIdOf, inMailDomain } from './mail-address.ts';
import type { InboxRecord } from './model.ts';
import { OptOuts } from './opt-outs.ts';
import type { AuthVerdict, InboxStore, MessageKey, MessageStore } from './ports.ts';
import { type Decision, type ReservationLedger, untrackedDecision } from './reservation-ledger.ts';
import { domainAndParents } from './sender-domains.ts';
import type { SmtpReplies } from './smtp-replies.ts';
import { ACCEPT, type Refusal, type Verdict } from './verdict.ts';

export interface MessageFacts {
  queueId: string;
  envelopeFrom: string;
  recipients: string[];
  /** The message as the sender sent it: header fields, the blank line and the body, in bytes. */
  sizeBytes: number;
  internetMessageId: string | null;
  auth: AuthVerdict;
  /** What Postfix's Received field will repeat of the client's words (receivedAllowance). */
  trace: ReceivedTrace;
}

export interface ReceivedTrace {
  helo: string | null;
  clientName: string | null;
  clientAddress: string;
}

export interface MessageSettings extends LifecycleSettings {
  mailDomain: string;
  maxMessageBytes: number;
  maxRejections: number;
  rejectionRetentionSeconds: number;
}

/**
 * Bytes reserved beyond the message as sent, for the two fields added before it is stored: our
 * Authentication-Results (counted exactly) and Postfix's Received (at most receivedAllowance()). The
 * stored message then counts its real size, so an inbox never holds more than its quota (save after a
 * milter is killed: mail/orphan-sweep.ts).
 *
 * Postfix's Received field is `from HELO (NAME [ADDRESS])`, `by` our host name `(Postfix) with
 * ESMTPSA id` the queue id, a TLS comment of up to a few hundred bytes, `for <RECIPIENT>` and the date.
 * RECEIVED_ALLOWANCE_BYTES covers all but the client's own words, which it sizes: its HELO name (up to
 * Postfix's 2,048-byte command line; a fixed 2 KiB for everything let a long HELO overfill an inbox,
 * until 2026-11-25), its host name and address, and the longest recipient.
 */
export const RECEIVED_ALLOWANCE_BYTES = 1024;

export function receivedAllowance(trace: ReceivedTrace, recipients: string[]): number {
  const bytes = (text: string | null) => (text ? Buffer.byteLength(text) : 0);
  return (
    RECEIVED_ALLOWANCE_BYTES +
    bytes(trace.helo) +
    bytes(trace.clientName) +
    bytes(trace.clientAddress) +
    Math.max(0, ...recipients.map(bytes))
  );
}

/**
 * A bound on what a reservation adds to the message as sent (our Authentication-Results field plus
 * receivedAllowance()), for the RCPT-time grouping rule (recipient-admission.ts): two inboxes can share
 * a transaction only if each has room for a message of the largest size plus this. The allowance is
 * at most about 5.4 KiB (1 KiB, a 2,048-byte HELO and RCPT line, a 255-byte host name, an address);
 * our field repeats the envelope sender and HELO and names each verified signature (at most
 * MAX_DKIM_SIGNATURES), a few KiB for real mail. A field beyond this bound (signatures with huge
 * tags) can still make two grouped inboxes disagree at end of data: that message gets the race's 451.
 */
export const MAX_ADDED_BYTES = 64 * 1024;

/**
 * The milter refuses for good a message whose header block, as the client sent it, is over this
 * (milter/session.ts), so the receiver reads every accepted header block whole (message-summary.ts).
 */
export const MAX_CLIENT_HEADER_BYTES = 1024 * 1024;

type Recorded = { reason: 'quota' | 'sender_not_allowed' | 'sender_opted_out'; senderDomain: string | null };
type Outcome = { verdict: Refusal; record?: Recorded };

export class MessageAdmission {
  readonly #inboxes: InboxStore;
  readonly #messages: MessageStore;
  readonly #clock: Clock;
  readonly #replies: SmtpReplies;
  readonly #settings: MessageSettings;
  readonly #ledger: ReservationLedger | null;

  /** `ledger`: this milter process's, whose incarnation each reservation names (reservation-ledger.ts). */
  constructor(
    inboxes: InboxStore,
    messages: MessageStore,
    clock: Clock,
    replies: SmtpReplies,
    settings: MessageSettings,
    ledger: ReservationLedger | null = null,
  ) {
    this.#inboxes = inboxes;
    this.#messages = messages;
    this.#clock = clock;
    this.#replies = replies;
    this.#settings = settings;
    this.#ledger = ledger;
  }

  /**
   * Opens the decision about a message to `recipients` in this process's ledger (reservation-ledger.ts):
   * the keys of every row it may reserve, one new message id per addressed inbox. The caller passes it
   * to admit() and closes it once the answer was handed to the MTA, or what admit() reserved was
   * withdrawn (withdraw(decision.keys)).
   */
  open(recipients: string[]): Decision {
    const keys = this.#inboxIds(this.#addressed(recipients)).map((inboxId) => ({
      inboxId,
      messageId: newMessageId(),
    }));
    return this.#ledger?.open(keys) ?? untrackedDecision(keys, this.#clock.now());
  }

  /**
   * The verdict for the whole message, decided at `decision`'s instant; on accept, it is reserved in
   * every recipient inbox under the decision's keys.
   */
  async admit(facts: MessageFacts, decision: Decision = this.open(facts.recipients)): Promise<Verdict> {
    const { now } = decision;
    if (facts.sizeBytes > this.#settings.maxMessageBytes) return this.#replies.messageTooBig;
    const { auth } = facts;
    // A failure a DNS outage may have caused (mailauth counts a temperror as not passing) is for now:
    // until 2026-11-25 a broken lookup of the sender's key bounced its mail for good.
    if (auth.dmarc.result === 'fail' && auth.dmarc.policy === 'reject')
      return auth.lookupFailed ? this.#replies.dmarcUnavailable : this.#replies.dmarcFailed;

    // The inboxes only, with the From: domain's opt-outs in the same read: their usage is read under
    // the inbox lock when reserving (reserveAll).
    const addressed = this.#addressed(facts.recipients);
    const authors = auth.authorDomains ?? (auth.fromDomain ? [auth.fromDomain] : []);
    const found = await this.#inboxes.findWithOptOuts(
      this.#inboxIds(addressed),
      authors.flatMap((domain) => OptOuts.namesCovering(domain)),
    );
    const targets = addressed.map((id) => (id ? found.inboxes.get(id) : undefined));
    const optedOut = authors.map((domain) => OptOuts.covering(domain, found.optedOut)).find((d) => d) ?? null;
    // An author DMARC could not be checked for is refused as failing it, unless an opt-out (recorded)
    // says more.
    if (auth.unverifiableAuthor && !optedOut) return this.#replies.dmarcFailed;
    const authenticatedDomain =
      auth.fromDomain && (auth.dmarc.result === 'pass' || auth.alignedDkimPass) ? auth.fromDomain : null;

    const outcomes = targets.map((target): Outcome | null => {
      const closed = closedInbox(target, now, this.#replies, this.#settings);
      if (closed) return { verdict: closed };
      if (optedOut) {
        return {
          verdict: this.#replies.senderOptedOut,
          record: { reason: 'sender_opted_out', senderDomain: optedOut },
        };
      }
      if (!admittedBySenderDomains(target as InboxRecord, authenticatedDomain)) {
        return {
          verdict: this.#replies.senderNotAllowed,
          record: { reason: 'sender_not_allowed', senderDomain: authenticatedDomain },
        };
      }
      return null;
    });
    const refusal = agreed(outcomes);
    if (refusal === 'disagree') return this.#replies.recipientsDisagree;
    if (refusal) {
      await this.#recordAll(facts, targets, refusal, now);
      return refusal.verdict;
    }

    const reservedBytes =
      facts.sizeBytes +
      Buffer.byteLength(`Authentication-Results: ${auth.headerValue}\r\n`) +
      receivedAllowance(facts.trace, facts.recipients);
    // Every recipient was accepted above, so every inbox exists.
    const inboxIds = [...new Set(targets.map((target) => (target as InboxRecord).inboxId))];
    const reservedBy = decision.owner;
    const reservations = inboxIds.map((inboxId) => ({
      inboxId,
      messageId: messageIdIn(decision, inboxId),
      queueId: facts.queueId,
      sizeBytes: reservedBytes,
      envelopeFrom: facts.envelopeFrom,
      now: decision.reservedAt,
      reservedBy,
    }));
    // The keys were named when the decision opened: if this commits and the process dies before the
    // answer, its heartbeat has named them, or dates them after itself (mail/orphan-sweep.ts). If it
    // fails, it may have committed before the error (the connection lost on the way back, the
    // statement cut by a timeout): the milter answers `t`, Postfix queues nothing, and the milter
    // withdraws the keys (undelivered()); left alone, they held quota for RESERVATION_TTL_SECONDS and
    // turned the sender's retry into a quota refusal (until 2026-11-25). A queue id already reserved in
    // an inbox keeps that row; withdrawing these keys leaves it alone.
    const outcome = await this.#messages.reserveAll(reservations);
    if (outcome.kind === 'reserved') return ACCEPT;
    if (outcome.inboxIds.length < inboxIds.length) {
      return this.#replies.recipientsDisagree;
    }
    const quota: Outcome = {
      verdict: this.#replies.quotaExceeded,
      record: { reason: 'quota', senderDomain: authenticatedDomain },
    };
    await this.#recordAll(facts, targets, quota, now);
    return quota.verdict;
  }

  /**
   * Undoes an accept the MTA never received (the milter's connection was lost before the verdict went
   * out, so Postfix answered the client 4xx and queued nothing): the reservations admit() made are
   * removed now, not RESERVATION_TTL_SECONDS later. Returns how many were removed.
   */
  withdraw(keys: readonly MessageKey[]): Promise<number> {
    return keys.length === 0 ? Promise.resolve(0) : this.#messages.withdrawReservations(keys);
  }

  /** Each recipient's inbox id, null for one that names no inbox (ourRecipients). */
  #addressed(recipients: string[]): (string | null)[] {
    const domain = this.#settings.mailDomain;
    return ourRecipients(recipients, domain).map((recipient) => inboxIdOf(recipient, domain));
  }

  /** The distinct inbox ids among `addressed`. */
  #inboxIds(addressed: (string | null)[]): string[] {
    return [...new Set(addressed.filter((id): id is string => id !== null))];
  }

  async #recordAll(
    facts: MessageFacts,
    targets: (InboxRecord | undefined)[],
    outcome: Outcome,
    now: Date,
  ): Promise<void> {
    const { record } = outcome;
    if (!record) return;
    const inboxIds = new Set(targets.flatMap((t) => (t ? [t.inboxId] : [])));
    for (const inboxId of inboxIds) {
      await this.#messages.recordRejection(
        {
          inboxId,
          reason: record.reason,
          envelopeFrom: facts.envelopeFrom,
          senderDomain: record.senderDomain,
          sizeBytes: facts.sizeBytes,
          internetMessageId: facts.internetMessageId,
          now,
        },
        this.#settings.maxRejections,
        addSeconds(now, -this.#settings.rejectionRetentionSeconds),
      );
    }
  }
}

/** The message id `decision` named for `inboxId` (open() names one for every addressed inbox). */
function messageIdIn(decision: Decision, inboxId: string): string {
  const key = decision.keys.find((k) => k.inboxId === inboxId);
  if (!key) throw new Error(`the decision named no row in inbox ${inboxId}`);
  return key.messageId;
}

/**
 * Contract section 4 (provision): with a non-empty list, only mail whose authenticated `From:` domain
 * is listed, or is a subdomain of an entry, is taken.
 */
function admittedBySenderDomains(inbox: InboxRecord, authenticatedDomain: string | null): boolean {
  const listed = inbox.senderDomains;
  if (listed.length === 0) return true;
  if (!authenticatedDomain) return false;
  return domainAndParents(authenticatedDomain).some((name) => listed.includes(name));
}

/** The refusal every recipient shares, null when all pass, 'disagree' when they differ. */
function agreed(outcomes: (Outcome | null)[]): Outcome | null | 'disagree' {
  const [first, ...rest] = outcomes;
  if (first === undefined) return null;
  const key = (o: Outcome | null) => (o ? `${o.verdict.code} ${o.verdict.text}` : 'accept');
  return rest.every((o) => key(o) === key(first)) ? first : 'disagree';
}

/**
 * The recipients this decision is about. Postfix accepts a bare `postmaster` without asking the policy
 * daemon (RFC 5321 4.5.1) and routes it to `discard:`; beside an inbox address it is left to that (else
 * the message would get a 451 on every retry for disagreeing with the inbox), alone it is answered
 * "no such inbox" like any address that is not an inbox.
 */
function ourRecipients(recipients: string[], mailDomain: string): string[] {
  const ours = recipients.filter((recipient) => inMailDomain(recipient, mailDomain));
  return ours.length > 0 ? ours : recipients;
}
