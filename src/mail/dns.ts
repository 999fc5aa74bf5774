/**
 * dns - the resolvers the mail side uses: DNS_SERVERS when set, else the system's (MAIL-FACTS E.3, F.2).
 *
 * ReverseDns asks for the PTR record itself with `resolvePtr`: `reverse()` reports a timed-out lookup as
 * ENOTFOUND, which would turn a DNS outage into a permanent 550 (MAIL-FACTS A.6).
 */
import { promises as dns } from 'node:dns';
import { isIPv4, isIPv6 } from 'node:net';
import type { ReverseDns } from '../core/ports.ts';

/** Per-query timeout and attempts: a dead server costs at most about 4 s before a 450. */
const TIMEOUT_MS = 2000;
const TRIES = 2;

export function createResolver(servers: string[]): dns.Resolver {
  const resolver = new dns.Resolver({ timeout: TIMEOUT_MS, tries: TRIES });
  if (servers.length > 0) resolver.setServers(servers);
  return resolver;
}

/** The in-addr.arpa or ip6.arpa name of an address (RFC 1035 3.5, RFC 3596 2.5). */
export function reverseName(address: string): string {
  if (isIPv4(address)) return `${address.split('.').reverse().join('.')}.in-addr.arpa`;
  if (isIPv6(address)) {
    // A dotted IPv4 at the end (`::1.2.3.4`) is the last two groups.
    const dotted = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(address);
    const group = (high?: string, low?: string) => ((Number(high) << 8) | Number(low)).toString(16);
    const hex = dotted
      ? `${address.slice(0, dotted.index)}${group(dotted[1], dotted[2])}:${group(dotted[3], dotted[4])}`
      : address;
    const [head = '', tail = ''] = hex.split('::');
    const groups = (part: string) => (part ? part.split(':') : []);
    const missing = 8 - groups(head).length - groups(tail).length;
    const full = [...groups(head), ...Array(hex.includes('::') ? missing : 0).fill('0'), ...groups(tail)];
    const nibbles = full.map((g) => g.padStart(4, '0')).join('');
    return `${[...nibbles].reverse().join('.')}.ip6.arpa`;
  }
  throw new Error(`not an IP address: ${address}`);
}

export class ResolverReverseDns implements ReverseDns {
  readonly #resolver: dns.Resolver;

  constructor(resolver: dns.Resolver) {
    this.#resolver = resolver;
  }

  async lookup(address: string): Promise<'found' | 'none' | 'unavailable'> {
    const plain = address.startsWith('::ffff:') && isIPv4(address.slice(7)) ? address.slice(7) : address;
    if (!isIPv4(plain) && !isIPv6(plain)) return 'none';
    try {
      const names = await this.#resolver.resolvePtr(reverseName(plain));
      return names.length > 0 ? 'found' : 'none';
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      return code === 'ENOTFOUND' || code === 'ENODATA' ? 'none' : 'unavailable';
    }
  }
}

/**
 * A name c-ares will not even ask for (`bad!sel._domainkey.bank.test`, a label over 63 characters, a
 * space) has no record: ENOTFOUND, not the DNS failure mailauth takes EBADNAME for. A sender's DKIM
 * selector chose it, and as a temperror it turned the p=reject refusal of a forged From: (550) into a
 * 451 the forger's MTA retried for days.
 */
function notFoundIfMalformed(error: NodeJS.ErrnoException): never {
  if (error.code !== 'EBADNAME') throw error;
  throw Object.assign(new Error(`${error.message} (malformed name: not found)`), {
    code: 'ENOTFOUND',
    hostname: (error as { hostname?: string }).hostname,
  });
}

/**
 * A cache in front of `resolve(name, rrtype)` for mailauth's SPF, DKIM and DMARC lookups, as a local
 * caching resolver would give an MTA: answers and "not found" are kept for `ttlMs` (records' own TTLs
 * are not exposed by node:dns), errors such as timeouts are not kept. Bounded to `maxEntries`.
 */
export class CachingLookup {
  readonly #resolver: dns.Resolver;
  readonly #ttlMs: number;
  readonly #maxEntries: number;
  readonly #entries = new Map<string, { until: number; answer: Promise<unknown> }>();

  constructor(resolver: dns.Resolver, ttlMs = 60_000, maxEntries = 10_000) {
    this.#resolver = resolver;
    this.#ttlMs = ttlMs;
    this.#maxEntries = maxEntries;
  }

  resolve(name: string, rrtype: string): Promise<unknown> {
    const key = `${rrtype} ${name.toLowerCase()}`;
    const now = Date.now();
    const hit = this.#entries.get(key);
    if (hit && hit.until > now) return hit.answer;
    const answer = this.#resolver.resolve(name, rrtype).catch(notFoundIfMalformed);
    if (this.#entries.size >= this.#maxEntries)
      this.#entries.delete(this.#entries.keys().next().value as string);
    this.#entries.set(key, { until: now + this.#ttlMs, answer });
    answer.catch((error: NodeJS.ErrnoException) => {
      if (error.code !== 'ENOTFOUND' && error.code !== 'ENODATA') this.#entries.delete(key);
    });
    return answer;
  }
}
