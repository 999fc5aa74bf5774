/**
 * signature-limits - the signature fields the milter lets mailauth verify (RFC 6376 section 6.1: a
 * verifier may limit the signatures it checks, to avoid denial of service).
 *
 * mailauth's work for a signature grows with the names its h= tag lists times the header fields it
 * looks them up in; it keeps each signature's covered fields, canonicalized, in memory, and checks the
 * signatures one after another without yielding. 3,000 DKIM-Signature fields over large fields froze
 * the milter for 23 s and 4,500 ran it out of heap; one signature naming tens of thousands of absent
 * fields, over hundreds of thousands of short ones, would freeze it as long.
 *
 * So a DKIM-Signature or ARC-Message-Signature whose h= lists more than MAX_SIGNED_NAMES names is left
 * out, and of the DKIM-Signature fields left, only the last (bottom) MAX_DKIM_SIGNATURES are kept: the
 * author's own signature is usually the bottom one (forwarders and lists add theirs above it), and a
 * name repeated in h= is matched from the bottom up (RFC 6376 section 5.4.2), so fields left out at the
 * top change no other signature's hash. The milter's header limits (milter/session.ts) bound the
 * number of fields.
 */
import type { MilterHeader } from '../milter/handler.ts';

/** Real mail carries one to three (author domain, ESP, forwarder). */
export const MAX_DKIM_SIGNATURES = 10;
/** Real signatures list a dozen or two (twice that when over-signing). */
export const MAX_SIGNED_NAMES = 200;

const DKIM_SIGNATURE = 'dkim-signature';
const SIGNATURES = new Set([DKIM_SIGNATURE, 'arc-message-signature']);

/** The header fields mailauth is given: `headers` itself when nothing is left out. */
export function verifiableHeaders(headers: MilterHeader[]): MilterHeader[] {
  const leftOut = new Set<MilterHeader>();
  const dkim: MilterHeader[] = [];
  for (const header of headers) {
    const name = header.name.toLowerCase();
    if (!SIGNATURES.has(name)) continue;
    if (signedNames(header.value) > MAX_SIGNED_NAMES) leftOut.add(header);
    else if (name === DKIM_SIGNATURE) dkim.push(header);
  }
  for (const header of dkim.slice(0, Math.max(0, dkim.length - MAX_DKIM_SIGNATURES))) leftOut.add(header);
  return leftOut.size === 0 ? headers : headers.filter((header) => !leftOut.has(header));
}

/**
 * How many names a signature field's h= tag lists (0 without one); with the tag repeated, the most any
 * of them lists: mailauth keeps the last, and counting only the first let 29,000 names through behind
 * `h=from` (a 14 s freeze of the milter).
 */
export function signedNames(value: string): number {
  let most = 0;
  for (const tag of value.matchAll(/(?:^|;)\s*h\s*=([^;]*)/gi))
    most = Math.max(most, (tag[1] ?? '').split(':').length);
  return most;
}
