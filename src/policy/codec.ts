/**
 * codec - the Postfix policy delegation wire format, pure and bounded (STYLE 7): bytes in, requests out;
 * a verdict in, `action=` bytes out. No I/O.
 *
 * Postfix SMTPD_POLICY_README, "Policy protocol description": a request is `name=value` lines ended by
 * an empty line; the reply is one `action=<access(5) action>` line and an empty line; attribute order
 * is not significant and unknown attributes are to be ignored; a missing value is absent, `name=`, or
 * for numbers `name=0`. Lines end in LF; a trailing CR is tolerated. For a repeated name the last value
 * wins (as postgrey does).
 *
 * Contract: PolicyRequestReader.push() either returns the complete requests of the bytes so far or
 * throws PolicyProtocolError; after a throw the stream cannot be resynchronized and the caller must
 * disconnect without a reply ("in case of trouble the policy server must not send a reply").
 */
import type { Verdict } from '../core/verdict.ts';
import { replyLine } from '../core/verdict.ts';
import type { PolicyRequest } from './handler.ts';

/** Postfix's own lines are far shorter (addresses ≤ 256 bytes, RFC 5321 §4.5.3.1.3). */
export const MAX_LINE_BYTES = 8 * 1024;
/** Postfix 3.7 sends about 35 attributes per request. */
export const MAX_ATTRIBUTES = 1000;
/** All lines of one request, terminators included. */
export const MAX_REQUEST_BYTES = 64 * 1024;
/** The only request type Postfix sends (SMTPD_POLICY_README). */
export const REQUEST_TYPE = 'smtpd_access_policy';

const LF = 0x0a;
const CR = 0x0d;

export class PolicyProtocolError extends Error {
  override name = 'PolicyProtocolError';
}

/** Splits a byte stream into policy requests, one connection's worth of state. */
export class PolicyRequestReader {
  #partial: Buffer[] = [];
  #partialBytes = 0;
  #attributes = new Map<string, string>();
  #lines = 0;
  #requestBytes = 0;

  /** The requests completed by `chunk`, in order. Throws PolicyProtocolError on a bound or syntax violation. */
  push(chunk: Buffer): PolicyRequest[] {
    const requests: PolicyRequest[] = [];
    let start = 0;
    for (let end = chunk.indexOf(LF); end !== -1; end = chunk.indexOf(LF, start)) {
      let line = chunk.subarray(start, end);
      if (this.#partialBytes > 0) {
        line = Buffer.concat([...this.#partial, line]);
        this.#partial = [];
        this.#partialBytes = 0;
      }
      start = end + 1;
      const request = this.#line(line);
      if (request) requests.push(request);
    }
    if (start < chunk.length) {
      const rest = chunk.subarray(start);
      this.#partial.push(rest);
      this.#partialBytes += rest.length;
      // +1: the CR that may still precede the LF.
      if (this.#partialBytes > MAX_LINE_BYTES + 1) throw new PolicyProtocolError('line too long');
      if (this.#requestBytes + this.#partialBytes > MAX_REQUEST_BYTES)
        throw new PolicyProtocolError('request too large');
    }
    return requests;
  }

  #line(raw: Buffer): PolicyRequest | undefined {
    this.#requestBytes += raw.length + 1;
    if (this.#requestBytes > MAX_REQUEST_BYTES) throw new PolicyProtocolError('request too large');
    const line = raw.length > 0 && raw[raw.length - 1] === CR ? raw.subarray(0, raw.length - 1) : raw;
    if (line.length > MAX_LINE_BYTES) throw new PolicyProtocolError('line too long');
    if (line.length === 0) {
      const attributes = this.#attributes;
      this.#attributes = new Map();
      this.#lines = 0;
      this.#requestBytes = 0;
      return toPolicyRequest(attributes);
    }
    if (++this.#lines > MAX_ATTRIBUTES) throw new PolicyProtocolError('too many attributes');
    const text = line.toString('utf8');
    const equals = text.indexOf('=');
    if (equals < 1) throw new PolicyProtocolError(equals === 0 ? 'empty attribute name' : 'line without "="');
    this.#attributes.set(text.slice(0, equals), text.slice(equals + 1));
    return undefined;
  }
}

/** Names Postfix's attributes, with the absent forms of SMTPD_POLICY_README normalized. */
export function toPolicyRequest(attributes: ReadonlyMap<string, string>): PolicyRequest {
  const request = attributes.get('request');
  if (request !== REQUEST_TYPE)
    throw new PolicyProtocolError(request === undefined ? 'no request attribute' : 'unknown request type');
  const text = (name: string) => attributes.get(name) ?? '';
  const name = (key: string) => attributes.get(key) || 'unknown';
  return {
    protocolState: text('protocol_state'),
    instance: text('instance'),
    clientAddress: text('client_address'),
    clientName: name('client_name'),
    reverseClientName: name('reverse_client_name'),
    heloName: text('helo_name'),
    sender: text('sender'),
    recipient: text('recipient'),
    size: count(attributes.get('size')),
    queueId: text('queue_id'),
    attributes,
  };
}

/**
 * A decimal count, 0 when absent or not a number. A count too large to hold exactly becomes the largest
 * safe integer, never 0: an absurd SIZE= must still fail a quota check.
 */
export function count(value: string | undefined): number {
  if (value === undefined || !/^[0-9]+$/.test(value)) return 0;
  const n = Number(value);
  return Number.isSafeInteger(n) ? n : Number.MAX_SAFE_INTEGER;
}

/**
 * The reply for one request: accept is `DUNNO` (no decision here; Postfix runs the next restriction),
 * a refusal is access(5)'s `4NN`/`5NN` form with its enhanced status code. Throws on a refusal whose
 * code does not match its kind or its DSN class: sending it would make Postfix guess.
 */
export function encodeAction(verdict: Verdict): string {
  if (verdict.kind === 'accept') return 'action=DUNNO\n\n';
  const klass = verdict.kind === 'defer' ? 4 : 5;
  if (!Number.isInteger(verdict.code) || Math.floor(verdict.code / 100) !== klass)
    throw new Error(`${verdict.kind} verdict with code ${verdict.code}`);
  if (!new RegExp(`^${klass}\\.\\d{1,3}\\.\\d{1,3}$`).test(verdict.dsn))
    throw new Error(`${verdict.kind} verdict with enhanced status code ${JSON.stringify(verdict.dsn)}`);
  return `action=${replyLine({ ...verdict, text: verdict.text.replace(/[\r\n]+/g, ' ') })}\n\n`;
}
