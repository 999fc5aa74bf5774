/**
 * message-summary - the poll fields read from a message's header block (contract section 2 "Message
 * summary"): `from`, `subject`, `internet_message_id`. Pure, no I/O.
 *
 * Invariants:
 * - bounded: only the first MAX_HEADER_BYTES of the header block are looked at, which is the whole of
 *   any block the milter accepted (1 MiB from the client, plus Postfix's Received: and our
 *   Authentication-Results:); a field cut by that bound is read as far as it goes. Until 2026-11-25
 *   the bound was 256 KiB, and a From:, Subject: or Message-ID: after it was taken for missing (the
 *   envelope sender listed as from, while DMARC had read the real From:). Each returned string is at
 *   most MAX_FIELD_CHARS characters;
 * - never throws on any input: bytes that are not UTF-8 decode as windows-1252, an encoded word is
 *   decoded as leniently as libmime does (characters outside base64 are skipped; an unknown charset
 *   passes its bytes through), NUL characters (which Postgres text refuses) are dropped, and other
 *   control characters, a decoded CR LF included, become spaces (no line break reaches an agent's log);
 * - headers are unfolded (RFC 5322 section 2.2.3); raw bytes are UTF-8 (RFC 6532, SMTPUTF8) or, failing
 *   that, windows-1252 (as WHATWG reads "latin1": mail that is not UTF-8 is mostly that); RFC 2047
 *   encoded words are decoded in `From:` display names and in `Subject:`. An obsolete source route
 *   (`<@relay:ada@example.org>`, RFC 5322 obs-route) is not part of the address.
 * - `from` is the first mailbox of the first `From:` field, `{name, address}`, both nullable; with no
 *   `From:` field (or an empty one) it is the envelope sender (null for the null sender `<>`).
 */
import { isUtf8 } from 'node:buffer';
import { createRequire } from 'node:module';
import addressparser from 'nodemailer/lib/addressparser';
import { MAX_ADDED_BYTES, MAX_CLIENT_HEADER_BYTES } from './message-admission.ts';
import type { DeliverySummary } from './ports.ts';

// libmime ships no type declarations; this is the one function used.
const libmime = createRequire(import.meta.url)('libmime') as { decodeWords(text: string): string };

export const MAX_HEADER_BYTES = MAX_CLIENT_HEADER_BYTES + MAX_ADDED_BYTES;
/** Longer strings are cut: the summary is shown in every poll, the full text is in the download. */
export const MAX_FIELD_CHARS = 4096;

export type MessageSummary = Omit<DeliverySummary, 'authentication'>;

export interface HeaderField {
  /** As written, without the colon. */
  name: string;
  /** Unfolded: line breaks removed, the folding whitespace kept; not trimmed. */
  value: string;
}

const windows1252 = new TextDecoder('windows-1252');

/**
 * Text of raw header bytes: UTF-8 when valid, else windows-1252 (every byte is then a character).
 * isUtf8 rather than a fatal decoder's exception: on a 1 MiB header of 10,000 Latin-1 fields the
 * exceptions took 60 ms of the receiver's event loop.
 */
function decodeBytes(bytes: Buffer): string {
  return isUtf8(bytes) ? bytes.toString('utf8') : windows1252.decode(bytes);
}

/**
 * Length of the header block including the blank line that ends it (CRLF CRLF, or LF LF from a lenient
 * sender), or -1 when `data` holds no end of header yet. A message opening with a blank line has no
 * headers: 2 (or 1).
 */
export function headerBlockLength(data: Buffer, from = 0): number {
  if (data[0] === 0x0a) return 1;
  if (data[0] === 0x0d && data[1] === 0x0a) return 2;
  // `from`: bytes before it were searched already; an end can start at most 2 bytes before it.
  for (let i = data.indexOf(0x0a, Math.max(0, from - 2)); i !== -1; i = data.indexOf(0x0a, i + 1)) {
    if (data[i + 1] === 0x0a) return i + 2;
    if (data[i + 1] === 0x0d && data[i + 2] === 0x0a) return i + 3;
  }
  return -1;
}

export interface FieldChoice {
  /** Only fields with these names (lowercase); the others are not decoded. */
  names?: ReadonlySet<string>;
  /** At most this many fields, from the top. */
  count?: number;
}

/**
 * The fields of a header block, in order, up to the blank line or `maxBytes`. A line that is neither a
 * field nor a continuation is skipped; a continuation before any field is skipped.
 */
export function headerFields(
  head: Buffer,
  maxBytes = MAX_HEADER_BYTES,
  choice: FieldChoice = {},
): HeaderField[] {
  const count = choice.count ?? Number.POSITIVE_INFINITY;
  const end = headerBlockLength(head);
  const block = head.subarray(0, Math.min(end === -1 ? head.length : end, maxBytes));
  const fields: HeaderField[] = [];
  let current: Buffer[] | null = null;
  const finish = () => {
    if (!current) return;
    const text = decodeBytes(Buffer.concat(current));
    const colon = text.indexOf(':');
    fields.push({ name: text.slice(0, colon).trim(), value: text.slice(colon + 1) });
    current = null;
  };
  for (let start = 0; start < block.length; ) {
    const newline = block.indexOf(0x0a, start);
    const stop = newline === -1 ? block.length : newline;
    const line = block.subarray(start, stop > start && block[stop - 1] === 0x0d ? stop - 1 : stop);
    start = stop + 1;
    if (line.length === 0) break;
    if (line[0] === 0x20 || line[0] === 0x09) {
      current?.push(line);
      continue;
    }
    finish();
    if (fields.length >= count) break;
    const colon = line.indexOf(0x3a);
    const name = colon > 0 ? line.subarray(0, colon).toString('latin1') : '';
    // A field name is 1*ftext (RFC 5322 section 3.6.8), maybe followed by obsolete WSP before the colon.
    if (/^[\x21-\x39\x3b-\x7e]+[ \t]*$/.test(name)) {
      if (!choice.names || choice.names.has(name.trimEnd().toLowerCase())) current = [line];
    }
  }
  finish();
  return fields;
}

// C0 controls but NUL (dropped) and tab, DEL, C1 controls (NEL among them; windows-1252 leaves five
// bytes as C1) and the Unicode line and paragraph separators: control characters are what it matches.
// biome-ignore lint/suspicious/noControlCharactersInRegex: on purpose
const CONTROL = /[\x01-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]/g;

/** Removes NULs and turns other controls into spaces: what an agent printing the field gets is text. */
export function printable(text: string): string {
  return (text.includes('\0') ? text.replaceAll('\0', '') : text).replace(CONTROL, ' ');
}

/** printable(), cut to MAX_FIELD_CHARS (not inside a surrogate pair). */
function clean(text: string): string {
  const printed = printable(text);
  if (printed.length <= MAX_FIELD_CHARS) return printed;
  const cut = printed.charCodeAt(MAX_FIELD_CHARS - 1);
  return printed.slice(0, cut >= 0xd800 && cut <= 0xdbff ? MAX_FIELD_CHARS - 1 : MAX_FIELD_CHARS);
}

/**
 * A B-encoded word whose text lacks its `=` padding (RFC 2047 wants it; some senders leave it out):
 * libmime joins adjacent words of one charset before decoding, and unpadded pieces then shifted every
 * later bit (`=?utf-8?B?YQ?= =?utf-8?B?Yg?=` read "a\x06 " instead of "ab"). Each gets its padding.
 */
const B_WORD = /=\?([^?\s]+)\?([Bb])\?([^?\s]*)\?=/g;
const padded = (text: string) =>
  text.replace(B_WORD, (word, charset: string, b: string, data: string) =>
    data.length % 4 === 0 ? word : `=?${charset}?${b}?${data}${'='.repeat(4 - (data.length % 4))}?=`,
  );

/** RFC 2047 decoding; a malformed encoded word or unknown charset leaves the text as written. */
function decodeWords(text: string): string {
  try {
    return libmime.decodeWords(padded(text));
  } catch {
    return text;
  }
}

const orNull = (text: string | undefined): string | null => (text ? clean(text) : null);

/** `@relay.test,@other.test:` before the address proper (RFC 5322 section 4.4, obs-route). */
const OBSOLETE_ROUTE = /^(?:@[^:,@\s]*[,\s]*)+:/;

/** `{name, address}` of the first mailbox in a `From:` value; groups are looked into. */
function parseFrom(value: string): { fromName: string | null; fromAddress: string | null } {
  let mailboxes: { name: string; address?: string }[];
  try {
    mailboxes = addressparser(value, { flatten: true });
  } catch {
    mailboxes = [];
  }
  const first = mailboxes.find((m) => m.address) ?? mailboxes[0];
  return {
    fromName: orNull(decodeWords(first?.name ?? '').trim()),
    fromAddress: orNull(first?.address?.trim().replace(OBSOLETE_ROUTE, '')),
  };
}

const SUMMARY_FIELDS: ReadonlySet<string> = new Set(['from', 'subject', 'message-id']);

/**
 * The summary of a message from its header block (bytes from the start of the message; anything after
 * the blank line is ignored) and the SMTP envelope sender ('' for the null sender).
 */
export function summarizeMessage(
  head: Buffer,
  envelopeFrom: string,
  maxHeaderBytes = MAX_HEADER_BYTES,
): MessageSummary {
  const first = new Map<string, string>();
  for (const field of headerFields(head, maxHeaderBytes, { names: SUMMARY_FIELDS })) {
    const key = field.name.toLowerCase();
    if (!first.has(key)) first.set(key, field.value);
  }
  const from = first.get('from');
  const subject = first.get('subject');
  const messageId = first.get('message-id')?.trim();
  return {
    ...(from?.trim()
      ? parseFrom(from)
      : { fromName: null, fromAddress: envelopeFrom ? clean(envelopeFrom) : null }),
    subject: subject === undefined ? null : clean(decodeWords(subject).trim()),
    internetMessageId: orNull(messageId),
  };
}
