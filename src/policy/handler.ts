/**
 * handler - what the policy adapter asks of the core: one decision per Postfix policy request.
 *
 * The adapter (server.ts) turns wire attributes into a PolicyRequest and a Verdict back into `action=`;
 * everything that decides lives behind PolicyHandler (STYLE 2). Postfix SMTPD_POLICY_README, "Policy
 * protocol description", defines the attributes named below.
 */
import type { Verdict } from '../core/verdict.ts';

/** One `request=smtpd_access_policy` request, with Postfix's "absent" forms already normalized. */
export interface PolicyRequest {
  /** CONNECT, EHLO, HELO, MAIL, RCPT, DATA, END-OF-MESSAGE, VRFY or ETRN; '' when absent. */
  protocolState: string;
  /** Correlates the requests of one message on one connection; '' when absent (e.g. before MAIL). */
  instance: string;
  clientAddress: string;
  /** The forward-confirmed client name, or 'unknown'. */
  clientName: string;
  /** The unverified PTR name, or 'unknown'. */
  reverseClientName: string;
  heloName: string;
  /** '' for the null sender `<>`. */
  sender: string;
  recipient: string;
  /** `SIZE=` from MAIL FROM until end of data, then the actual size; 0 when absent or not a number. */
  size: number;
  queueId: string;
  /** Every attribute received, including the ones above and unknown ones; for the last duplicate, the last value. */
  attributes: ReadonlyMap<string, string>;
}

/**
 * The decisions for one Postfix policy connection (one smtpd process). decide() is called strictly one
 * request at a time, in arrival order: the next call starts only after the previous promise settled.
 * A rejected promise means internal trouble: the adapter logs it and disconnects without a reply, so
 * Postfix retries and then applies its default_action (SMTPD_POLICY_README). close() is called once,
 * when the connection is gone; decide() is never called after it.
 */
export interface PolicyConnection {
  decide(request: PolicyRequest): Promise<Verdict>;
  /**
   * What Postfix got for the request: the verdict written, or null when the connection was dropped
   * without a reply (a decision that failed or passed its deadline, a reply that could not be
   * encoded, a peer already gone). Postfix then tries again on a new connection (up to
   * smtpd_policy_service_try_limit) or applies default_action. For counting and logging; must not throw.
   */
  answered?(request: PolicyRequest, verdict: Verdict | null): void;
  close(): void;
}

/**
 * Makes one PolicyConnection per accepted Postfix connection. Per-transaction state belongs in the
 * connection, keyed by `instance`: a new instance means the previous transaction ended or was aborted.
 */
export interface PolicyHandler {
  connect(): PolicyConnection;
}
