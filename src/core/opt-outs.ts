/**
 * opt-outs - which requested sender domains a domain owner has asked us to refuse (contract section 4,
 * provision and sender-domains): an entry is refused when it or any parent domain is opted out, never
 * because one of its subdomains is.
 */
import { ServiceError } from './errors.ts';
import type { OptOutStore } from './ports.ts';
import { domainAndParents } from './sender-domains.ts';

export class OptOuts {
  readonly #store: OptOutStore;

  constructor(store: OptOutStore) {
    this.#store = store;
  }

  /** The entries of a normalized list that are refused. */
  async refused(domains: string[]): Promise<string[]> {
    if (domains.length === 0) return [];
    const optedOut = new Set(await this.#store.findOptedOut([...new Set(domains.flatMap(domainAndParents))]));
    return domains.filter((domain) => domainAndParents(domain).some((name) => optedOut.has(name)));
  }

  /** The names whose opt-out would cover a sender's domain: the domain and its parents. */
  static namesCovering(domain: string): string[] {
    return domainAndParents(domain.toLowerCase());
  }

  /**
   * The registered opt-out that covers a sender's domain (the domain itself or its closest opted-out
   * parent), or null, from `registered`: the registered ones among namesCovering(domain), as InboxStore
   * reads them along with the inboxes.
   */
  static covering(domain: string, registered: string[]): string | null {
    if (registered.length === 0) return null;
    const found = new Set(registered);
    return OptOuts.namesCovering(domain).find((name) => found.has(name)) ?? null;
  }

  /** Throws 409 sender_opted_out naming the refused entries. */
  async assertAllowed(domains: string[]): Promise<void> {
    const refused = await this.refused(domains);
    if (refused.length > 0) {
      throw new ServiceError(
        'sender_opted_out',
        `These sender domains have opted out: ${refused.join(', ')}.`,
        {
          field: 'sender_domains',
          domains: refused,
        },
      );
    }
  }
}
