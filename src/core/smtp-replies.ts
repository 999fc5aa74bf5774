/**
 * smtp-replies - the one module that knows SMTP reply texts (STYLE 5).
 *
 * Contract section 4 "Receiving mail" gives the reason texts; DESIGN decision 2 gives the codes and
 * where each is said. `<service>` in `555 5.7.1 <service>: <reason>` is MAIL_DOMAIN. Postfix prefixes
 * a policy daemon's text (`<rcpt>: Recipient address rejected: ...`); a milter's reaches the sender
 * byte for byte (MAIL-FACTS A.3, C.5).
 */
import type { Refusal, Verdict } from './verdict.ts';

export interface ReplySettings {
  mailDomain: string;
  abuseContact: string;
}

const reject = (code: number, dsn: string, text: string): Refusal => ({ kind: 'reject', code, dsn, text });
const defer = (code: number, dsn: string, text: string): Refusal => ({ kind: 'defer', code, dsn, text });

export type SmtpReplies = ReturnType<typeof smtpReplies>;

export function smtpReplies({ mailDomain, abuseContact }: ReplySettings) {
  const svc = mailDomain;
  return Object.freeze({
    /** CONNECT, no PTR record for the client (NXDOMAIN or no data). */
    noReverseDns: reject(550, '5.7.25', 'Sender IP reverse lookup rejected'),
    /** CONNECT, the PTR query timed out or failed: the sender may try again (RFC 8601 aside, RFC 7372 4.7.25). */
    reverseDnsUnavailable: defer(450, '4.7.25', 'Sender IP reverse lookup failed, try again later'),
    noSuchInbox: reject(555, '5.7.1', `${svc}: no such inbox`),
    inboxExpired: reject(555, '5.7.1', `${svc}: inbox expired`),
    inboxCancelled: reject(555, '5.7.1', `${svc}: address disabled for abuse; reports: ${abuseContact}`),
    senderOptedOut: reject(555, '5.7.1', `${svc}: sender domain opted out`),
    quotaExceeded: reject(555, '5.7.1', `${svc}: mailbox quota exceeded`),
    /** Contract 4: a sender not admitted by sender_domains gets a 4xx so its server keeps retrying. */
    senderNotAllowed: defer(451, '4.7.1', `${svc}: sender not allowed by this inbox, try again later`),
    /** RFC 5321 4.5.3.1.10: the recipient is sent again in a separate transaction (DESIGN decision 3). */
    separateTransaction: defer(452, '4.5.3', `${svc}: send this recipient in a separate transaction`),
    /** The recipients of one transaction came out differently at end of data (a race): all retry. */
    recipientsDisagree: defer(451, '4.5.3', `${svc}: recipients need separate transactions, try again`),
    dmarcFailed: reject(550, '5.7.1', 'DMARC checks failed'),
    /** A DMARC failure under p=reject that a DNS failure may have caused: the sender tries again. */
    dmarcUnavailable: defer(451, '4.7.1', 'DMARC checks could not be completed, try again later'),
    /** RFC 5321 4.5.3.1.9 / RFC 3463 5.3.4: over the fixed size limit (contract section 8: 25 MiB). */
    messageTooBig: reject(552, '5.3.4', 'Message size exceeds fixed maximum message size'),
    ...deliveryReplies(mailDomain),
  });
}

/**
 * The LMTP receiver's refusals, per recipient after Postfix queued the mail: only ever 4xx, so Postfix
 * keeps the message and retries (DESIGN decision 1; STYLE 4: our trouble is never a 5xx).
 */
export function deliveryReplies(mailDomain: string) {
  return Object.freeze({
    /** The store failed (the database is down, say): Postfix redelivers later, nothing is lost. */
    storeFailed: defer(451, '4.3.0', `${mailDomain}: temporary failure storing the message, try again later`),
    /** More distinct inboxes in one delivery than it stores at once: Postfix resends the rest. */
    tooManyRecipients: defer(452, '4.5.3', `${mailDomain}: too many recipients, try again later`),
  });
}

/**
 * What a verdict was, for metrics and log lines: `accepted`, or the name of the reply above in
 * snake_case (`no_such_inbox`, `quota_exceeded`, ...); `other` for a refusal made elsewhere.
 */
export function replyReason(replies: SmtpReplies, verdict: Verdict): string {
  if (verdict.kind === 'accept') return 'accepted';
  for (const [name, reply] of Object.entries(replies)) {
    if (reply.code === verdict.code && reply.dsn === verdict.dsn && reply.text === verdict.text) {
      return name.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
    }
  }
  return 'other';
}
