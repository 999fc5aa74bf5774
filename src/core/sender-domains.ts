/**
 * sender-domains - the `sender_domains` rules of contract section 2 ("Sender domain entries").
 *
 * An entry is a domain name with at least two labels, 1 to 254 characters in all (a trailing dot
 * allowed), labels of 1 to 63 letters, digits and hyphens not starting or ending with a hyphen, and a
 * last label of 2 to 63 characters. Entries are stored lowercased (trailing dot dropped), deduplicated
 * and sorted; more than 20 entries is out of bounds.
 */
import { invalidRequest, outOfBounds } from './errors.ts';

export const MAX_SENDER_DOMAINS = 20;

const LABEL = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/i;

export function isDomainName(entry: string): boolean {
  if (entry.length < 1 || entry.length > 254) return false;
  const name = entry.endsWith('.') ? entry.slice(0, -1) : entry;
  const labels = name.split('.');
  if (labels.length < 2) return false;
  if (!labels.every((label) => LABEL.test(label))) return false;
  const last = labels[labels.length - 1] as string;
  return last.length >= 2;
}

/** Checks and normalizes a request's list. Throws invalid_request or out_of_bounds. */
export function normalizeSenderDomains(value: unknown, field = 'sender_domains'): string[] {
  if (!Array.isArray(value)) throw invalidRequest(field, `${field} must be an array of domain names.`);
  if (value.length > MAX_SENDER_DOMAINS) throw outOfBounds(field, 0, MAX_SENDER_DOMAINS, value.length);
  value.forEach((entry, index) => {
    if (typeof entry !== 'string') {
      // Not echoed: an entry may be any JSON value, nested thousands deep.
      const kind = entry === null ? 'null' : Array.isArray(entry) ? 'an array' : `a ${typeof entry}`;
      throw invalidRequest(field, `${field}[${index}] is ${kind}, not a domain name.`);
    }
    if (!isDomainName(entry)) {
      const shown = entry.length > 80 ? `${entry.slice(0, 80)}...` : entry;
      throw invalidRequest(field, `${field}[${index}] ${JSON.stringify(shown)} is not a domain name.`);
    }
  });
  const normalized = (value as string[]).map((d) => (d.endsWith('.') ? d.slice(0, -1) : d).toLowerCase());
  return [...new Set(normalized)].sort();
}

/** A domain and every parent domain with at least two labels: a.b.example.com → [a.b.example.com, b.example.com, example.com]. */
export function domainAndParents(domain: string): string[] {
  const labels = domain.split('.');
  const out: string[] = [];
  for (let i = 0; i <= labels.length - 2; i++) out.push(labels.slice(i).join('.'));
  return out;
}
