/**
 * authentication-results - the contract's `authentication` object (section 2 "Message summary"), read
 * from the Authentication-Results field our milter put at the top of the message (DESIGN decision 6,
 * RFC 8601). Pure, no I/O.
 *
 * Invariants:
 * - only the FIRST header field of the message is read, and only if it is Authentication-Results with
 *   our authserv-id (compared case-insensitively, comments removed). A field further down, or one with
 *   another authserv-id, was written by someone else and never counts: the answer is then null;
 * - anything the tokenizer cannot read as RFC 8601 section 2.2 gives null ("missing or unreadable"),
 *   never a partial object, and never an exception;
 * - bounded: a first field longer than MAX_FIELD_CHARS (64 Ki characters) is unreadable; the tokenizer
 *   is one linear pass.
 */

import { isUtf8 } from 'node:buffer';
import { isIP } from 'node:net';
import { domainToASCII } from 'node:url';
import { asciiDomain, domainsAlign, plainDomain } from './mail-address.ts';
import { headerFields } from './message-summary.ts';
import type { Authentication } from './model.ts';

export const MAX_FIELD_CHARS = 64 * 1024;

/** One `method=result` element (RFC 8601 `resinfo`). Keys of `properties` are lowercase `ptype.property`. */
export interface ResultInfo {
  /** Lowercase, without its `/version`. */
  method: string;
  /** Lowercase. */
  result: string;
  reason: string | null;
  properties: Map<string, string>;
}

export interface AuthenticationResults {
  /** Lowercase. */
  authservId: string;
  results: ResultInfo[];
}

type Token = { kind: 'word' | 'quoted' | ';' | '='; text: string; spaced: boolean };

/**
 * Splits an unfolded field value into words, quoted strings (unescaped), `;` and `=`. Comments (nested,
 * with `\` escapes; RFC 5322 section 3.2.2) count as whitespace; a `(` or `;` inside a quoted string is
 * text. Returns null for an unterminated comment or quoted string. Stops after `limit` tokens.
 */
function tokenize(value: string, limit = Number.POSITIVE_INFINITY): Token[] | null {
  const tokens: Token[] = [];
  let spaced = false;
  let i = 0;
  while (i < value.length && tokens.length < limit) {
    const c = value[i] as string;
    if (c === ' ' || c === '\t' || c === '\r' || c === '\n') {
      spaced = true;
      i++;
    } else if (c === '(') {
      let depth = 0;
      for (; i < value.length; i++) {
        const d = value[i];
        if (d === '\\') i++;
        else if (d === '(') depth++;
        else if (d === ')' && --depth === 0) break;
      }
      if (depth !== 0) return null;
      spaced = true;
      i++;
    } else if (c === ')') {
      return null;
    } else if (c === '"') {
      let text = '';
      for (i++; i < value.length && value[i] !== '"'; i++) {
        if (value[i] === '\\') i++;
        text += value[i] ?? '';
      }
      if (i >= value.length) return null;
      tokens.push({ kind: 'quoted', text, spaced });
      spaced = false;
      i++;
    } else if (c === ';' || c === '=') {
      tokens.push({ kind: c, text: c, spaced });
      spaced = false;
      i++;
    } else {
      const start = i;
      while (i < value.length && !' \t\r\n()";='.includes(value[i] as string)) i++;
      tokens.push({ kind: 'word', text: value.slice(start, i), spaced });
      spaced = false;
    }
  }
  return tokens;
}

const KEYWORD = /^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$/i;

/**
 * `key = value` pairs of one element after its `method=result`: the key is the words before `=`
 * (`header` `.` `from` joins to `header.from`), the value a word or quoted string, extended by tokens
 * that follow without whitespace (a base64 `header.b=ab+/=` written unquoted).
 */
function readPairs(tokens: Token[], start: number): [string, string][] | null {
  const pairs: [string, string][] = [];
  let i = start;
  while (i < tokens.length) {
    let key = '';
    while (tokens[i]?.kind === 'word') key += (tokens[i++] as Token).text;
    if (!key || tokens[i]?.kind !== '=') return null;
    i++;
    const first = tokens[i];
    if (!first || (first.kind !== 'word' && first.kind !== 'quoted')) return null;
    let value = first.text;
    for (i++; i < tokens.length && !(tokens[i] as Token).spaced; i++) value += (tokens[i] as Token).text;
    pairs.push([key.toLowerCase(), value]);
  }
  return pairs;
}

/** One `method[/version]=result [reason=...] ptype.property=value ...` element; null if malformed. */
function readResult(tokens: Token[]): ResultInfo | null {
  let i = 0;
  let method = '';
  while (tokens[i]?.kind === 'word') method += (tokens[i++] as Token).text;
  method = method.split('/')[0] ?? '';
  const result = tokens[i + 1];
  if (!KEYWORD.test(method) || tokens[i]?.kind !== '=' || result?.kind !== 'word') return null;
  if (!KEYWORD.test(result.text)) return null;
  const pairs = readPairs(tokens, i + 2);
  if (!pairs) return null;
  const info: ResultInfo = {
    method: method.toLowerCase(),
    result: result.text.toLowerCase(),
    reason: null,
    properties: new Map(),
  };
  for (const [key, value] of pairs) {
    if (key === 'reason') info.reason = value;
    else if (/^[a-z0-9-]+\.[^.]+$/.test(key) && !info.properties.has(key)) info.properties.set(key, value);
    else if (!key.includes('.')) return null;
  }
  return info;
}

/** Parses an Authentication-Results field value (after the colon, unfolded); null when unreadable. */
export function parseAuthenticationResults(value: string): AuthenticationResults | null {
  if (value.length > MAX_FIELD_CHARS) return null;
  const tokens = tokenize(value);
  if (!tokens) return null;
  const elements: Token[][] = [[]];
  for (const token of tokens) {
    if (token.kind === ';') elements.push([]);
    else (elements[elements.length - 1] as Token[]).push(token);
  }
  const [head = [], ...rest] = elements;
  const [id, version, ...extra] = head;
  if (!id || id.kind === ';' || id.kind === '=' || !id.text || extra.length > 0) return null;
  if (version && !(version.kind === 'word' && /^\d+$/.test(version.text))) return null;
  const results: ResultInfo[] = [];
  for (const element of rest) {
    // `; none` means no results (RFC 8601 no-result); a trailing `;` leaves an empty element.
    if (element.length === 0 || (element.length === 1 && element[0]?.text.toLowerCase() === 'none')) continue;
    const info = readResult(element);
    if (!info) return null;
    results.push(info);
  }
  // A quoted authserv-id is compared without the folding white space around it.
  return { authservId: trimFws(id.text).toLowerCase(), results };
}

/**
 * SP, HTAB, CR and LF at either end, nothing else: a field's id is read strictly, so that a U+00A0 or a
 * U+FEFF next to it makes it another id (JavaScript's trim() removed those too, and a field the milter
 * read byte by byte as not ours was then read as ours here).
 */
function trimFws(text: string): string {
  return text.replace(/^[ \t\r\n]+|[ \t\r\n]+$/g, '');
}

/** Unicode white space and format characters (U+00A0, U+3000, U+200B, U+FEFF, bidi marks...). */
const INVISIBLE = /[\p{White_Space}\p{Cf}]/gu;

/**
 * Whether the field value `raw` (its bytes as latin1 characters, as the milter has them) claims the
 * authserv-id `ours` (lowercase), read generously, for removal (RFC 8601 section 5): its id as bytes and
 * as UTF-8, each compatibility-normalized (NFKC), without Unicode white space or format characters and
 * lowercased. A sender's field that any reader, however lenient, could take for ours is removed; the
 * receiver reads ours strictly (parseAuthenticationResults). Only the id is read: a field that claims
 * ours and is malformed further on still claims it.
 */
export function claimsAuthservId(raw: string, ours: string): boolean {
  const bytes = Buffer.from(raw, 'latin1');
  const forms = isUtf8(bytes) ? [raw, bytes.toString('utf8')] : [raw];
  return forms.some((value) => {
    const [first] = tokenize(value, 1) ?? [];
    if (!first || (first.kind !== 'word' && first.kind !== 'quoted')) return false;
    const visible = first.text.replace(INVISIBLE, '');
    // Normalizing a long token costs milliseconds (a 54 KB field) and cannot make it our id: NFKC never
    // drops a character that is not white space (removed already), and what it composes is not ASCII.
    if (visible.length > 4 * ours.length + 16) return false;
    const normalized = visible.normalize('NFKC').replace(INVISIBLE, '').toLowerCase();
    // Also as a domain name: a Unicode spelling of an IDN id (`mx.bücher.example` for
    // mx.xn--bcher-kva.example), or with a trailing dot.
    return normalized === ours || asciiDomain(normalized) === ours;
  });
}

/**
 * The domain of `local@domain`, or the value itself when it is a bare domain; lowercase; null if empty
 * or not a domain name (an address literal such as a HELO of `[127.0.0.3]`).
 */
function domainOf(identity: string | undefined): string | null {
  if (identity === undefined) return null;
  const domain = plainDomain(
    identity
      .slice(identity.lastIndexOf('@') + 1)
      .replaceAll('\0', '')
      .trim(),
  );
  if (domain.startsWith('[') || isIP(domain) !== 0) return null;
  // An internationalized name in its ASCII form (`xn--`), as DMARC's and the sender_domains list have it.
  // Only such a name: the URL host parser behind domainToASCII also percent-decodes and reads numbers
  // as IPv4 addresses, so an ASCII name is kept as written, and one that has no ASCII form too.
  if (/^[\x20-\x7e]*$/.test(domain) || domain.includes('%')) return domain || null;
  const ascii = domainToASCII(domain);
  return ascii && isIP(ascii) === 0 ? ascii : domain;
}

const NONE = { result: 'none', domain: null } as const;

/**
 * The contract's object from parsed results (contract section 2; MAIL-FACTS E.4 mapping). `envelopeFrom`
 * (the LMTP MAIL FROM, '' for the null sender) names SPF's domain when our field has no
 * `smtp.mailfrom`: mailauth leaves out a property over 900 bytes, and a long envelope sender then
 * left `smtp.helo`, a name the client chooses, to stand for the SPF pass (until 2026-11-25). Only for
 * the null sender is the HELO name SPF's identity (RFC 7208 section 2.4).
 */
export function toAuthentication(field: AuthenticationResults, envelopeFrom = ''): Authentication {
  const first = (method: string) => field.results.find((r) => r.method === method);
  const dmarc = first('dmarc');
  const fromDomain = domainOf(dmarc?.properties.get('header.from'));
  const dkimDomain = (r: ResultInfo) =>
    domainOf(r.properties.get('header.d')) ?? domainOf(r.properties.get('header.i'));
  const dkims = field.results.filter((r) => r.method === 'dkim');
  const passes = dkims.filter((r) => r.result === 'pass');
  const dkim =
    passes.find((r) => {
      const d = dkimDomain(r);
      return fromDomain !== null && d !== null && domainsAlign(d, fromDomain);
    }) ??
    passes[0] ??
    dkims[0];
  const spf = first('spf');
  return {
    dmarc: dmarc ? { result: dmarc.result, domain: fromDomain } : { ...NONE },
    dkim: dkim ? { result: dkim.result, domain: dkimDomain(dkim) } : { ...NONE },
    spf: spf
      ? {
          result: spf.result,
          domain:
            domainOf(spf.properties.get('smtp.mailfrom')) ??
            (envelopeFrom === '' ? domainOf(spf.properties.get('smtp.helo')) : domainOf(envelopeFrom)),
        }
      : { ...NONE },
  };
}

/**
 * The `authentication` object of a stored message from its header block: null unless the first field is
 * a readable Authentication-Results with authserv-id `authservId`.
 */
export function readAuthentication(
  head: Buffer,
  authservId: string,
  envelopeFrom = '',
): Authentication | null {
  const [firstField] = headerFields(head, undefined, { count: 1 });
  if (firstField?.name.toLowerCase() !== 'authentication-results') return null;
  const parsed = parseAuthenticationResults(firstField.value);
  if (!parsed || parsed.authservId !== authservId.toLowerCase()) return null;
  return toAuthentication(parsed, envelopeFrom);
}
