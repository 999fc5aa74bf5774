/**
 * mailauth-authenticator - DKIM, SPF and DMARC with mailauth (DESIGN decision 6, MAIL-FACTS E).
 *
 * The authserv-id is AUTHSERV_ID; DNS goes through our resolver (DNS_SERVERS). ARC is evaluated and
 * reported; BIMI is off (it would fetch logos over HTTPS). A DNS failure becomes a `temperror` result
 * inside mailauth, never an exception; anything mailauth throws is the caller's temporary failure.
 *
 * mailauth is loaded on first use, or by loadMailauth() (the milter calls it at start-up, so that a
 * mailauth that fast-linebreaks.ts cannot patch stops the milter at once): it is about a third of a
 * daemon's heap, and only the milter needs it. Loading it swaps mailauth's byte-by-byte line-break pass
 * for fast-linebreaks.ts.
 *
 * The body matters to mailauth only through body hashes: one per DKIM-Signature, and one for the newest
 * ARC-Message-Signature. Without such a field the verdict is the same with or without the body
 * (test/mail/mailauth-body.test.ts checks that against mailauth itself), so readsBody() says no and the
 * milter hands over the header block alone: a 1 MiB unsigned message is not walked a second time.
 */
import { Readable } from 'node:stream';
import type { AuthenticateResult } from 'mailauth';
import { asciiDomain, domainOf, domainsAlign, plainDomain } from '../core/mail-address.ts';
import type { AuthenticationRequest, Authenticator, AuthVerdict } from '../core/ports.ts';
import type { CachingLookup } from './dns.ts';
import { installFastLinebreaks } from './fast-linebreaks.ts';
import { installFastRelaxedBody } from './fast-relaxed-body.ts';

let mailauth: Promise<typeof import('mailauth')> | undefined;

/**
 * Loads mailauth and patches its line-break pass and its relaxed body canonicalization, once; rejects
 * if a patch does not fit.
 */
export function loadMailauth(): Promise<typeof import('mailauth')> {
  mailauth ??= import('mailauth').then((module) => {
    installFastLinebreaks();
    installFastRelaxedBody();
    return module;
  });
  return mailauth;
}

export class MailauthAuthenticator implements Authenticator {
  readonly #authservId: string;
  readonly #resolver: CachingLookup;

  constructor(authservId: string, resolver: CachingLookup) {
    this.#authservId = authservId;
    this.#resolver = resolver;
  }

  /**
   * DMARC for each author domain of a message with several, as if it were the only one (RFC 7489
   * 6.6.1 lets a receiver apply each), side by side: the verdict is the strictest, a failure under
   * `p=reject` if any, or a `temperror` if a lookup failed. The domains are mailauth's own (A-labels,
   * every candidate of an address with several `@`, as a mail client might show either): until
   * 2026-11-25 our own parsing missed both, and `ceo@strict.test@lax.test` got past `p=reject`.
   */
  async #eachAuthor(result: AuthenticateResult): Promise<{
    domains: string[];
    dmarc: AuthVerdict['dmarc'];
    unverifiable?: boolean;
    rejecting?: string[];
  }> {
    const [{ dmarc }, { getAuthorDomain }] = await Promise.all([
      import('mailauth/lib/dmarc/index.js'),
      import('mailauth/lib/dmarc/author-domain.js'),
    ]);
    const author = getAuthorDomain(result.dkim.headerFrom ?? [], result.dkim.fromFields);
    const domains = (author.domains ?? []).filter((domain) => !domain.startsWith('['));
    if (domains.length > MAX_AUTHOR_DOMAINS)
      return { domains, dmarc: { result: 'none', policy: null }, unverifiable: true };
    const spf = result.spf && result.spf.status.result === 'pass' ? [result.spf.domain] : [];
    const dkim = (result.dkim.results ?? [])
      .filter((r) => r.status.result === 'pass' && r.signingDomain)
      .map((r) => ({ domain: r.signingDomain as string }));
    // At most MAX_AUTHOR_DOMAINS at once: five lookups that never answer cost one timeout, not five.
    const evaluated = await Promise.all(
      domains.map((domain) =>
        dmarc({
          headerFrom: `postmaster@${domain}`,
          spfDomains: spf,
          dkimDomains: dkim,
          resolver: (name: string, rrtype: string) =>
            this.#resolver.resolve(name, rrtype) as Promise<string[][] | string[]>,
        }),
      ),
    );
    const rejecting = domains.filter((_, i) => {
      const v = evaluated[i];
      return v && v.status.result === 'fail' && enforcedPolicy(v) === 'reject';
    });
    if (rejecting.length > 0) return { domains, dmarc: { result: 'fail', policy: 'reject' }, rejecting };
    const temperror = evaluated.some((v) => v && v.status.result === 'temperror');
    return {
      domains,
      dmarc: temperror ? { result: 'temperror', policy: null } : { result: 'none', policy: null },
    };
  }

  readsBody(headerNames: readonly string[]): boolean {
    return headerNames.some(signsBody);
  }

  async authenticate(request: AuthenticationRequest): Promise<AuthVerdict> {
    const { authenticate } = await loadMailauth();
    const result = await authenticate(Readable.from(request.message, { objectMode: false }), {
      ip: request.clientAddress,
      helo: request.helo ?? undefined,
      sender: request.envelopeFrom,
      mta: this.#authservId,
      disableBimi: true,
      resolver: (name, rrtype) => this.#resolver.resolve(name, rrtype) as Promise<string[][] | string[]>,
    });
    const dmarc = result.dmarc || null;
    const several = SEVERAL_AUTHORS.has((result as { dmarcSkipReason?: string }).dmarcSkipReason ?? '')
      ? await this.#eachAuthor(result)
      : undefined;
    const fromDomain = plainDomain(dmarc?.status.header?.from ?? '') || null;
    // The author domains as a reader shows them, which mailauth did not check (it converts a non-ASCII
    // name without UTS-46 mapping: `pay\u00adpal.test`, with a soft hyphen, was checked as
    // xn--paypal-dja.test and got past paypal.test's p=reject, while a reader shows paypal.test).
    const checked = new Set(several ? several.domains.map(plainDomain) : fromDomain ? [fromDomain] : []);
    const unchecked = [
      ...new Set(
        (result.dkim.headerFrom ?? []).flatMap((address) => {
          const shown = domainOf(address);
          return shown && !shown.startsWith('[') && !checked.has(shown) ? [shown] : [];
        }),
      ),
    ];
    // A failure under p=reject is for now (451) when a failed lookup may explain it: for the From:
    // domain, or with several authors for every one that failed (until 2026-11-25, with several, never,
    // and a DNS failure behind it was a 550, a bounce; one that failed on its own is still a 550).
    const failing = several ? (several.rejecting ?? []).map(plainDomain) : fromDomain ? [fromDomain] : [];
    const failedLookups = [
      ...(result.spf && result.spf.status.result === 'temperror' ? [result.spf.domain] : []),
      ...(result.dkim.results ?? [])
        .filter((r) => r.status.result === 'temperror')
        .map((r) => r.signingDomain),
    ].flatMap((domain) => (domain ? [asciiDomain(domain)] : []));
    const lookupFailed =
      failing.length > 0 &&
      failing.every((author) => failedLookups.some((domain) => domainsAlign(domain, author)));
    return {
      ...(lookupFailed && { lookupFailed: true }),
      // Without trailing dots (`allowed.test.` is allowed.test): the lists it is checked against
      // (sender_domains, opt-outs) hold plain domains (until 2026-11-25 it got past both).
      fromDomain,
      ...((several || unchecked.length > 0) && { authorDomains: [...checked, ...unchecked] }),
      // Refused as failing DMARC, after the opt-outs of every domain (message-admission.ts).
      ...((several?.unverifiable || unchecked.length > 0) && { unverifiableAuthor: true }),
      dmarc: several?.dmarc ?? {
        result: dmarc ? dmarc.status.result : 'none',
        policy: dmarc ? enforcedPolicy(dmarc) : null,
      },
      alignedDkimPass: (result.dkim.results ?? []).some(
        (r) => r.status.result === 'pass' && r.status.aligned,
      ),
      headerValue: authResultsValue(result.headers),
    };
  }
}

/**
 * The policy as published, before mailauth lowers it for `t=y` (RFC 9989's test mode: `reject` read
 * as `quarantine`, `quarantine` as `none`). The contract refuses mail failing DMARC for a domain with
 * policy `p=reject` (sections 2 and 4) and has no test mode; until 2026-11-25 such mail was delivered.
 */
function enforcedPolicy(verdict: { policy?: string | null; testMode?: boolean }): string | null {
  const policy = verdict.policy ?? null;
  return verdict.testMode && policy === 'quarantine' ? 'reject' : policy;
}

/**
 * mailauth's reasons for not evaluating DMARC that name more than one author domain (RFC 9989 5.3.1).
 * Such mail used to pass as if it had no DMARC at all: a `From:` naming a `p=reject` domain beside
 * another got past `p=reject`, and one naming an opted-out domain past the opt-out (until 2026-11-25).
 */
const SEVERAL_AUTHORS = new Set(['multiple-author-domains', 'multiple-from-fields', 'invalid-author-domain']);

/**
 * At most this many author domains are evaluated; a `From:` naming more is refused as failing DMARC.
 * Each costs up to 8 DNS lookups (the record and its tree walk): a header naming thousands made one
 * message send tens of thousands of queries, timing out the evaluation of the one `p=reject` domain
 * among them and of other mail's lookups beside it.
 */
export const MAX_AUTHOR_DOMAINS = 5;

/** The value of the Authentication-Results field in mailauth's `headers` text (fields end in CRLF). */
export function authResultsValue(headers: string): string {
  const field = headers
    .split(/\r\n(?=[^ \t])/)
    .find((f) => f.toLowerCase().startsWith('authentication-results:'));
  if (!field) throw new Error('mailauth wrote no Authentication-Results field');
  return field
    .slice('authentication-results:'.length)
    .replace(/^[ \t]+/, '')
    .replace(/\r\n$/, '');
}

/**
 * A field whose signature covers the body: DKIM-Signature, or any ARC-* field (only the
 * ARC-Message-Signature hashes the body; the others are counted in to stay on the safe side). The name
 * is normalized as mailauth's header parser does (line breaks dropped, blanks trimmed, lower case);
 * toLowerCase() folds more than mailauth's ASCII-only folding, so it can only say yes more often.
 */
function signsBody(name: string): boolean {
  const key = name
    .replace(/[\r\n]/g, '')
    .replace(/^[ \t]+|[ \t]+$/g, '')
    .toLowerCase();
  return key === 'dkim-signature' || key.startsWith('arc-');
}
