/**
 * mail-address - how mail addresses map to inboxes (contract section 1: `<inbox_id>@{mail_domain}`),
 * and the one written form of an SMTP address every part of the service reports.
 *
 * One address reaches us in three spellings: the milter sees the MAIL and RCPT arguments as the client
 * wrote them (`<"john"@example.com>`, `<@relay:box@svc>`), the policy daemon gets Postfix's internal
 * form with the quotes taken off (`john doe@example.com`), and the receiver gets Postfix's requoting of
 * that. smtpAddress() and quotedAddress() turn the first two into the third, so a recipient is the same
 * inbox at RCPT and at end of data, and `envelope_from` is the same string on a message and on every
 * rejection of its sender (contract section 2).
 */
import { domainToASCII } from 'node:url';
import { INBOX_ID } from './ids.ts';

/** The inbox id an address names, or null: the domain must be MAIL_DOMAIN (any case), the local part an inbox id. */
export function inboxIdOf(address: string, mailDomain: string): string | null {
  const bare = address.startsWith('<') && address.endsWith('>') ? address.slice(1, -1) : address;
  if (!inMailDomain(bare, mailDomain)) return null;
  const local = bare.slice(0, bare.lastIndexOf('@')).toLowerCase();
  return INBOX_ID.test(local) ? local : null;
}

/**
 * The domain of an address (plainDomain), in A-labels, or null for the null sender or no domain. An
 * SMTPUTF8 client may write the envelope sender's domain in Unicode (`x@bücher.example`), which Postfix
 * hands on as sent; the lists hold `xn--` names only, so until 2026-11-25 such a sender got past the
 * opt-outs. A name IDNA cannot convert is kept as written.
 */
export function domainOf(address: string): string | null {
  const at = address.lastIndexOf('@');
  if (at < 0 || at === address.length - 1) return null;
  // White space around the domain is allowed in a header address (`user@ example.com`, RFC 5322 CFWS).
  return asciiDomain(address.slice(at + 1).trim()) || null;
}

/**
 * A domain name as a mail reader shows it, in its ASCII form: a name with a non-ASCII character goes
 * through UTS-46 (domainToASCII: A-labels, invisible characters such as a soft hyphen dropped,
 * full-width letters folded), or stays as written if it has no such form; then plainDomain. An ASCII
 * name is kept as written (the URL host parser behind domainToASCII would read `127.1` as an address).
 */
export function asciiDomain(domain: string): string {
  return plainDomain(unicodeToAscii(domain));
}

/**
 * A name with a non-ASCII character through UTS-46 (as written if it has no such form); an ASCII one
 * as written.
 */
function unicodeToAscii(domain: string): string {
  return /\P{ASCII}/u.test(domain) ? domainToASCII(domain) || domain : domain;
}

/**
 * A domain name as the service's lists hold it (sender_domains, opt-outs): lowercased, trailing dots
 * dropped, so `Example.COM..` is example.com. Only one dot was dropped until 2026-11-25, and a name
 * written with two got past the opt-outs.
 */
export function plainDomain(name: string): string {
  return name.toLowerCase().replace(/\.+$/, '');
}

/** Relaxed alignment as the brief defines it: equal, or one a subdomain of the other (plain domains). */
export function domainsAlign(a: string, b: string): boolean {
  return a === b || a.endsWith(`.${b}`) || b.endsWith(`.${a}`);
}

/** The domain part of an address, compared as inbox addresses are: in any case. */
export function inMailDomain(address: string, mailDomain: string): boolean {
  const at = address.lastIndexOf('@');
  if (at <= 0) return false;
  // An IDN mail domain may come in Unicode (an SMTPUTF8 client's RCPT; smtp-server hands every LMTP
  // recipient's domain over so, punycode.toUnicode); an ASCII one is compared as written.
  return unicodeToAscii(address.slice(at + 1)).toLowerCase() === mailDomain.toLowerCase();
}

/**
 * An SMTP path's address as Postfix passes it on (RFC 5321 4.1.2), read the way Postfix's lenient
 * parser reads it: angle brackets, a source route (`@a,@b:`), comments and unquoted white space are
 * dropped; quotes are taken off and a backslash escapes the next character, inside quotes or not; a
 * domain literal stays as written. The local part is then quoted again only where a dot-string does
 * not allow it. `<>` is ''.
 */
export function smtpAddress(path: string): string {
  const trimmed = path.trim();
  const inner = trimmed.startsWith('<') && trimmed.endsWith('>') ? trimmed.slice(1, -1) : trimmed;
  // The common case: nothing to drop or unquote, the path is already Postfix's internal form.
  if (!LENIENT_SYNTAX.test(inner)) return quotedAddress(inner);
  // Each character kept, and whether it was quoted or escaped (then it separates nothing).
  const kept: { ch: string; literal: boolean }[] = [];
  let quoted = false;
  let literal = false;
  let comment = 0;
  for (let i = 0; i < inner.length; i++) {
    const ch = inner[i] as string;
    if (ch === '\\' && i + 1 < inner.length) {
      i++;
      if (comment === 0) kept.push({ ch: inner[i] as string, literal: true });
    } else if (comment > 0) {
      if (ch === '(') comment++;
      else if (ch === ')') comment--;
    } else if (quoted) {
      if (ch === '"') quoted = false;
      else kept.push({ ch, literal: true });
    } else if (literal) {
      if (ch === ']') literal = false;
      kept.push({ ch, literal: true });
    } else if (ch === '"') {
      quoted = true;
    } else if (ch === '(') {
      comment = 1;
    } else if (ch !== ' ' && ch !== '\t') {
      if (ch === '[') literal = true;
      kept.push({ ch, literal: ch === '[' });
    }
  }
  const separator = (c: { ch: string; literal: boolean }, ch: string) => !c.literal && c.ch === ch;
  const route = kept[0] && separator(kept[0], '@') ? kept.findIndex((c) => separator(c, ':')) : -1;
  // Postfix's internal form (the policy daemon's view), quoted as Postfix writes it on.
  return quotedAddress(
    kept
      .slice(route + 1)
      .map((c) => c.ch)
      .join(''),
  );
}

/** What smtpAddress() must read character by character: quotes, escapes, comments, white space,
 * domain literals, a source route. */
const LENIENT_SYNTAX = /["\\()[\s]|^@/;

/** An address in Postfix's internal form (the local part unquoted, as policy requests carry it), quoted. */
export function quotedAddress(internal: string): string {
  const at = internal.lastIndexOf('@');
  if (at < 0) return quoteLocalPart(internal);
  return `${quoteLocalPart(internal.slice(0, at))}@${internal.slice(at + 1)}`;
}

/** Characters besides controls and space that a dot-string cannot hold (RFC 5321 4.1.2; 8-bit clean). */
const SPECIALS = '<>()[]\\,;:@"';

function isDotString(local: string): boolean {
  if (local.startsWith('.') || local.endsWith('.') || local.includes('..')) return false;
  for (let i = 0; i < local.length; i++) {
    const code = local.charCodeAt(i);
    if (code <= 0x20 || code === 0x7f || SPECIALS.includes(local[i] as string)) return false;
  }
  return true;
}

function quoteLocalPart(local: string): string {
  if (local === '') return '';
  return isDotString(local) ? local : `"${local.replace(/["\\]/g, '\\$&')}"`;
}
