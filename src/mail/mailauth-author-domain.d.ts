/** mailauth's Author Domain extraction (RFC 9989 5.3.1), which its package ships without types. */
declare module 'mailauth/lib/dmarc/author-domain.js' {
  /**
   * `authorDomain` when the addresses name exactly one domain; otherwise `reason` and `domains`, each an
   * A-label, lowercased, without the trailing dot (every candidate of an address with several `@`).
   */
  export function getAuthorDomain(
    headerFrom: string[],
    fromFields?: number,
  ): { authorDomain?: string; domain?: string; reason?: string; domains?: string[] };
}
