/**
 * mail-address - how mail addresses map to inboxes (contract section 1: `<inbox_id>@{mail_domain}`).
 */
import { INBOX_ID } from './ids.ts';

/** The inbox id an address names, or null: the domain must be MAIL_DOMAIN (any case), the local part an inbox id. */
export function inboxIdOf(address: string, mailDomain: string): string | null {
  const bare = address.startsWith('<') && address.endsWith('>') ? address.slice(1, -1) : address;
  const at = bare.lastIndexOf('@');
  if (at <= 0) return null;
  if (bare.slice(at + 1).toLowerCase() !== mailDomain.toLowerCase()) return null;
  const local = bare.slice(0, at).toLowerCase();
  return INBOX_ID.test(local) ? local : null;
}

/** The domain of an address (lowercased, trailing dot dropped), or null for the null sender or no domain. */
export function domainOf(address: string): string | null {
  const at = address.lastIndexOf('@');
  if (at < 0 || at === address.length - 1) return null;
  const domain = address.slice(at + 1).toLowerCase();
  return domain.endsWith('.') ? domain.slice(0, -1) : domain;
}
