/**
 * ids - identifier formats of contract section 1 ("Identifier formats").
 *
 * All random identifiers use the lowercase Crockford base32 alphabet. 20 characters carry 100 bits,
 * 32 characters 160 bits (DESIGN decision 10: credentials are 160-bit random tokens).
 */
import { randomBytes } from 'node:crypto';

export const ALPHABET = '0123456789abcdefghjkmnpqrstvwxyz';

export const INBOX_ID = /^[0-9a-hjkmnp-tv-z]{20}$/;
export const MESSAGE_ID = /^msg_[0-9a-hjkmnp-tv-z]{20}$/;
export const OWNER_CREDENTIAL = /^rmo_[0-9a-hjkmnp-tv-z]{32}$/;
export const READER_CREDENTIAL = /^rmr_[0-9a-hjkmnp-tv-z]{32}$/;
/** 1 to 255 printable ASCII characters, 0x21 to 0x7e (contract section 5.7). */
export const IDEMPOTENCY_KEY = /^[\x21-\x7e]{1,255}$/;

/** A random string of `length` characters from ALPHABET (5 random bits each, no modulo bias). */
export function randomBase32(length: number): string {
  const bytes = randomBytes(length);
  let out = '';
  for (let i = 0; i < length; i++) out += ALPHABET[(bytes[i] as number) & 31];
  return out;
}

export const newInboxId = (): string => randomBase32(20);
export const newMessageId = (): string => `msg_${randomBase32(20)}`;
export const newOwnerCredential = (): string => `rmo_${randomBase32(32)}`;
export const newReaderCredential = (): string => `rmr_${randomBase32(32)}`;
