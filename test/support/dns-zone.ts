/**
 * dns-zone - the sender domains and client addresses the end-to-end suite uses, as records for
 * startDnsmasq(), with freshly generated DKIM keys (RSA 2048, made once per process on first use).
 *
 * Domains (selector `sel`):
 *   allowed.test  SPF pass for 127/8, DKIM key, DMARC p=reject  (the well-behaved sender)
 *   other.test    same as allowed.test with its own key          (allowlist mismatch)
 *   strict.test   SPF -all excluding 127/8, no DKIM, p=reject     (DMARC fails: 550 5.7.1)
 *   lax.test      SPF ?all, no DKIM, DMARC p=none                 (DMARC fails, not refused)
 *   optout.test   SPF pass, DKIM key, DMARC p=none                (the opted-out domain)
 *   keyonly.test  SPF pass, DKIM key, no DMARC record             (authenticated by aligned DKIM alone)
 *   xallowed.test SPF pass, DMARC p=none                          (a look-alike of allowed.test)
 * Client addresses (MAIL-FACTS F.3): see CLIENTS. dkimSignFor() signs with mailauth and throws if it
 * cannot (unknown domain, signing error). resolveInZone() answers mailauth's lookups from the same TXT
 * records without a DNS server, for tests and benchmarks that call mailauth directly.
 */
import { generateKeyPairSync } from 'node:crypto';
import { dkimSign } from 'mailauth';
import type { DnsRecords } from './dnsmasq.ts';

export const DKIM_SELECTOR = 'sel';

/** Source addresses a test binds (swaks --local-interface, smtp_bind_address) to play each case. */
export const CLIENTS = {
  /** PTR mail.sender.test, whose A record points back: client_name is verified. */
  good: '127.0.0.3',
  /** No PTR record: NXDOMAIN. */
  noPtr: '127.0.0.2',
  /** The PTR query times out (a temporary failure). */
  ptrTimeout: '127.0.0.4',
  /** PTR nofwd.sender.test without an A record: reverse name known, client_name unknown. */
  unconfirmedPtr: '127.0.0.5',
} as const;

export const SENDER_DOMAINS = [
  'allowed.test',
  'other.test',
  'strict.test',
  'lax.test',
  'optout.test',
  'keyonly.test',
  'xallowed.test',
] as const;
export type SenderDomain = (typeof SENDER_DOMAINS)[number];

const SPF_PASS = 'v=spf1 ip4:127.0.0.0/8 -all';

export interface TestZone {
  records: DnsRecords;
  /** PEM private keys of the domains that publish a DKIM key. */
  privateKeys: Partial<Record<SenderDomain, string>>;
}

function dkimKey(): { privateKey: string; record: string } {
  const { publicKey, privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  const spki = publicKey.export({ type: 'spki', format: 'der' }).toString('base64');
  return {
    privateKey: privateKey.export({ type: 'pkcs8', format: 'pem' }).toString(),
    record: `v=DKIM1; k=rsa; p=${spki}`,
  };
}

let zone: TestZone | undefined;

export function testZone(): TestZone {
  if (zone) return zone;
  const txt: Record<string, string> = {
    'allowed.test': SPF_PASS,
    '_dmarc.allowed.test': 'v=DMARC1; p=reject',
    'other.test': SPF_PASS,
    '_dmarc.other.test': 'v=DMARC1; p=reject',
    'strict.test': 'v=spf1 ip4:192.0.2.1 -all',
    '_dmarc.strict.test': 'v=DMARC1; p=reject',
    'lax.test': 'v=spf1 ?all',
    '_dmarc.lax.test': 'v=DMARC1; p=none',
    'optout.test': SPF_PASS,
    '_dmarc.optout.test': 'v=DMARC1; p=none',
    'keyonly.test': SPF_PASS,
    'xallowed.test': SPF_PASS,
    '_dmarc.xallowed.test': 'v=DMARC1; p=none',
  };
  const privateKeys: TestZone['privateKeys'] = {};
  for (const domain of ['allowed.test', 'other.test', 'optout.test', 'keyonly.test'] as const) {
    const key = dkimKey();
    txt[`${DKIM_SELECTOR}._domainkey.${domain}`] = key.record;
    privateKeys[domain] = key.privateKey;
  }
  zone = {
    records: {
      txt,
      a: { 'mail.sender.test': CLIENTS.good },
      ptr: { [CLIENTS.good]: 'mail.sender.test', [CLIENTS.unconfirmedPtr]: 'nofwd.sender.test' },
      ptrTimeout: [CLIENTS.ptrTimeout],
      localDomains: ['test'],
    },
    privateKeys,
  };
  return zone;
}

/** The message with a DKIM-Signature (d=domain, s=sel, rsa-sha256) prepended. */
export async function dkimSignFor(
  domain: string,
  message: Buffer,
  canonicalization: 'relaxed/relaxed' | 'simple/simple' = 'relaxed/relaxed',
): Promise<Buffer> {
  const privateKey = testZone().privateKeys[domain as SenderDomain];
  if (!privateKey) throw new Error(`${domain} publishes no DKIM key in the test zone`);
  const signer = { signingDomain: domain, selector: DKIM_SELECTOR, privateKey };
  // mailauth signs only what is in signatureData; its typings also want the fields at the top level.
  const result = await dkimSign(message, {
    ...signer,
    canonicalization,
    algorithm: 'rsa-sha256',
    signatureData: [signer],
  });
  if (result.errors.length > 0 || result.signatures === '') {
    throw new Error(
      `DKIM signing for ${domain} failed: ${result.errors.map((e) => e.err.message).join('; ')}`,
    );
  }
  return Buffer.concat([Buffer.from(result.signatures), message]);
}

/**
 * The zone's TXT records as dns.promises.resolve(name, rrtype) gives them (mailauth's `resolver`
 * option, MAIL-FACTS E.3): one record of one or more strings; any other name or type throws ENOTFOUND.
 */
export async function resolveInZone(name: string, rrtype: string): Promise<string[][]> {
  const value = rrtype === 'TXT' ? testZone().records.txt?.[name.toLowerCase()] : undefined;
  if (value !== undefined) return [typeof value === 'string' ? [value] : value];
  throw Object.assign(new Error(`query${rrtype} ENOTFOUND ${name}`), { code: 'ENOTFOUND' });
}
