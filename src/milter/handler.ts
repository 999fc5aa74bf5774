/**
 * handler - what the milter adapter asks of the core: one MessageConsumer per message, begun at end of
 * headers, fed the body, asked for the verdict at end of message (STYLE 2: protocol code translates, the
 * core decides).
 *
 * The adapter guarantees, per connection: calls are strictly sequential (the next milter packet is not
 * read until the promise of the previous call has settled); each consumer gets body() zero or more
 * times, then exactly one of end() or abort(), except that abort() may also arrive while a body() call is
 * still pending (the connection was lost). A consumer whose body() rejected gets abort() and never end().
 */
import type { Verdict } from '../core/verdict.ts';

export interface MilterEnvelope {
  /** Macro `i`, the Postfix queue id (empty string if Postfix never sent it). */
  queueId: string;
  /** From the SMFIC_CONNECT packet ('' for a unix-domain or unknown address family). */
  clientAddress: string;
  /** Verified host name from SMFIC_CONNECT; null when Postfix sent "[ip]" (or "unknown"). */
  clientName: string | null;
  helo: string | null;
  /** MAIL FROM without <> ('' for the null sender). */
  envelopeFrom: string;
  /** ESMTP args of MAIL, e.g. ['SIZE=1234']. */
  mailArgs: string[];
  /** RCPT TO addresses without <>, in order, of this transaction. */
  recipients: string[];
  /**
   * All macros seen so far in this connection and transaction, a snapshot taken at end of headers.
   * Names are as sent (e.g. 'i', '{client_addr}'). Macros of an earlier transaction are not included.
   */
  macros: ReadonlyMap<string, string>;
}

/**
 * One header field as received, in message order, without the Received: header Postfix adds itself.
 * `value` is everything after the colon exactly as received (SMFIP_HDR_LEADSPC: the leading space is
 * kept), folded lines separated by '\n'; so `name + ':' + value` with '\n' turned into '\r\n' rebuilds the
 * header byte for byte. Both are decoded as latin1, one character per byte, so any bytes (UTF-8,
 * raw 8-bit) round-trip exactly with Buffer.from(text, 'latin1'): DKIM signs bytes. Whitespace between a name and its colon is lost (Postfix
 * strips it before the milter sees the header).
 */
export interface MilterHeader {
  name: string;
  value: string;
}

export interface HeaderEdits {
  /** Instances to delete: name and 1-based index among headers of that name as received. */
  delete: { name: string; index: number }[];
  /**
   * Headers to insert at a 0-based position (0 = top, above Postfix's Received). value WITHOUT the
   * leading space; may contain '\r\n' or '\n' folds followed by whitespace. Sent in array order after
   * all deletes, so each index counts the headers as they are after the previous inserts.
   */
  insert: { index: number; name: string; value: string }[];
}

export interface MessageConsumer {
  /** A body chunk exactly as received (CRLF line ends). Resolve when ready for more (backpressure). */
  body(chunk: Buffer): Promise<void>;
  /**
   * End of message: the verdict, and header edits applied only when the verdict is accept. If the promise
   * rejects, or the verdict or an edit is one Postfix would refuse, the message fails temporarily (`t`).
   */
  end(): Promise<{ verdict: Verdict; edits?: HeaderEdits }>;
  /** The transaction was aborted (SMFIC_ABORT, new MAIL, QUIT, connection lost) before end(). Must not throw. */
  abort(): void;
  /**
   * end()'s verdict was handed to the MTA (written to its connection). Must not throw. Exactly one of
   * delivered() and undelivered() follows every end().
   */
  delivered?(): void;
  /**
   * end() settled, but no verdict of it reached the MTA: the connection was lost first, the verdict
   * could not be sent, or end() failed or passed its deadline (answered `t` instead). Postfix then
   * applies milter_default_action or the `t` and queues nothing, so whatever end() did (for an
   * accept, or before it failed) may be undone.
   */
  undelivered(): Promise<void>;
}

/** What the MTA was told about a message: a verdict, or `t` (or nothing, which Postfix takes as `t`). */
export type MessageAnswer = Verdict | 'tempfail';

export interface MilterHandler {
  /**
   * Called once per transaction at end of headers (SMFIC_EOH). Throwing makes this message fail
   * temporarily (SMFIR_TEMPFAIL); the connection stays usable for the next transaction.
   */
  beginMessage(envelope: MilterEnvelope, headers: MilterHeader[]): MessageConsumer;
  /**
   * Once per message that got an answer other than `continue`: the answer as sent, whoever decided it
   * (the consumer's verdict; our own refusal of a header too large; `t` for a failure, a decision past
   * its deadline, or a verdict the lost connection never carried). For counting and logging. Must not
   * throw.
   */
  answered?(message: { queueId: string; recipients: string[] }, answer: MessageAnswer): void;
}
