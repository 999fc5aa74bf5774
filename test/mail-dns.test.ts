/**
 * The mail side's DNS helpers without a network: the reverse name of a client address (RFC 1035 3.5,
 * RFC 3596 2.5) and the answer cache in front of mailauth's lookups.
 */
import assert from 'node:assert/strict';
import type { promises as dns } from 'node:dns';
import { test } from 'node:test';
import { CachingLookup, reverseName } from '../src/mail/dns.ts';

test('reverse names of IPv4 and IPv6 addresses, compressed or not', () => {
  assert.equal(reverseName('127.0.0.3'), '3.0.0.127.in-addr.arpa');
  assert.equal(
    reverseName('2001:db8::567:89ab'),
    'b.a.9.8.7.6.5.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.8.b.d.0.1.0.0.2.ip6.arpa',
  );
  assert.equal(reverseName('::1'), `1.${'0.'.repeat(31)}ip6.arpa`);
  // An IPv4 written dotted at the end of an IPv6 address is its last 32 bits.
  assert.equal(reverseName('::1.2.3.4'), `4.0.3.0.2.0.1.0.${'0.'.repeat(24)}ip6.arpa`);
  assert.equal(reverseName('64:ff9b::192.0.2.33'), reverseName('64:ff9b::c000:221'));
  assert.throws(() => reverseName('mail.sender.test'), /not an IP address/);
});

/** A resolver that answers from a table and counts the questions it was asked. */
function countingResolver(answers: Record<string, string[][] | NodeJS.ErrnoException>) {
  const asked: string[] = [];
  const resolver = {
    resolve: async (name: string, rrtype: string) => {
      asked.push(`${rrtype} ${name}`);
      const answer = answers[name];
      if (answer instanceof Error) throw answer;
      return answer ?? [];
    },
  };
  return { asked, resolver: resolver as unknown as dns.Resolver };
}

const dnsError = (code: string) => Object.assign(new Error(code), { code });

test('answers and "not found" are kept for the TTL; timeouts are asked again', async () => {
  const { asked, resolver } = countingResolver({
    'allowed.test': [['v=spf1 -all']],
    'missing.test': dnsError('ENOTFOUND'),
    'slow.test': dnsError('ETIMEOUT'),
  });
  let now = 0;
  const realNow = Date.now;
  Date.now = () => now;
  try {
    const cache = new CachingLookup(resolver, 1000, 2);
    assert.deepEqual(await cache.resolve('allowed.test', 'TXT'), [['v=spf1 -all']]);
    assert.deepEqual(await cache.resolve('Allowed.Test', 'TXT'), [['v=spf1 -all']]);
    await assert.rejects(cache.resolve('missing.test', 'TXT'), { code: 'ENOTFOUND' });
    await assert.rejects(cache.resolve('missing.test', 'TXT'), { code: 'ENOTFOUND' });
    assert.deepEqual(asked, ['TXT allowed.test', 'TXT missing.test']);

    await assert.rejects(cache.resolve('slow.test', 'TXT'), { code: 'ETIMEOUT' });
    await assert.rejects(cache.resolve('slow.test', 'TXT'), { code: 'ETIMEOUT' });
    assert.equal(asked.filter((q) => q === 'TXT slow.test').length, 2, 'a timeout is not kept');

    now = 1001;
    await cache.resolve('allowed.test', 'TXT');
    assert.equal(asked.filter((q) => q === 'TXT allowed.test').length, 2, 'asked again after the TTL');
  } finally {
    Date.now = realNow;
  }
});

test('the cache holds at most maxEntries answers, dropping the oldest', async () => {
  const { asked, resolver } = countingResolver({ 'a.test': [['a']], 'b.test': [['b']], 'c.test': [['c']] });
  const cache = new CachingLookup(resolver, 60_000, 2);
  for (const name of ['a.test', 'b.test', 'c.test', 'c.test', 'b.test', 'a.test'])
    await cache.resolve(name, 'TXT');
  assert.deepEqual(asked, ['TXT a.test', 'TXT b.test', 'TXT c.test', 'TXT a.test']);
});

test('a name c-ares refuses as malformed is not found, not a DNS failure, and is kept', async () => {
  // A real resolver: c-ares refuses these before asking any server (the server below does not exist).
  const { promises } = await import('node:dns');
  const resolver = new promises.Resolver({ timeout: 200, tries: 1 });
  resolver.setServers(['127.0.0.1:9']);
  let asked = 0;
  const counting = {
    resolve: (name: string, rrtype: string) => {
      asked++;
      return resolver.resolve(name, rrtype);
    },
  } as unknown as typeof resolver;
  const cache = new CachingLookup(counting);
  const names = [
    'bad!sel._domainkey.bank.test',
    'x y._domainkey.bank.test',
    `${'a'.repeat(64)}._domainkey.bank.test`,
  ];
  for (const name of [...names, ...names])
    await assert.rejects(cache.resolve(name, 'TXT'), { code: 'ENOTFOUND' }, name);
  assert.equal(asked, names.length, 'each asked once: kept as not found');
});
