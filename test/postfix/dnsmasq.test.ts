/**
 * The test DNS: dnsmasq serving the end-to-end zone (test/support/dns-zone.ts) answers the PTR cases
 * of MAIL-FACTS F.3 the way the policy daemon will see them, and a message signed with dkimSignFor
 * verifies through mailauth against it. Needs root (dnsmasq binds port 53).
 */
import assert from 'node:assert/strict';
import { Resolver } from 'node:dns/promises';
import { after, before, describe, test } from 'node:test';
import { authenticate } from 'mailauth';
import { CLIENTS, DKIM_SELECTOR, dkimSignFor, testZone } from '../support/dns-zone.ts';
import { type Dnsmasq, dnsmasqConf, startDnsmasq } from '../support/dnsmasq.ts';

let dns: Dnsmasq;
let resolver: Resolver;

before(async () => {
  assert.equal(process.getuid?.(), 0, 'dnsmasq needs root to bind port 53');
  dns = await startDnsmasq({ records: testZone().records });
  resolver = new Resolver({ timeout: 1500, tries: 1 });
  resolver.setServers([dns.address]);
});
after(async () => {
  await dns?.stop();
});

async function errorCode(promise: Promise<unknown>): Promise<string | undefined> {
  try {
    await promise;
    return undefined;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code;
  }
}

const ptr = (ip: string) => resolver.resolvePtr(`${ip.split('.').reverse().join('.')}.in-addr.arpa`);

describe('PTR records of the client addresses', () => {
  test('127.0.0.3 has PTR mail.sender.test, whose A record points back', async () => {
    assert.deepEqual(await ptr(CLIENTS.good), ['mail.sender.test']);
    assert.deepEqual(await resolver.resolve4('mail.sender.test'), [CLIENTS.good]);
  });

  test('127.0.0.5 has PTR nofwd.sender.test without an A record', async () => {
    assert.deepEqual(await ptr(CLIENTS.unconfirmedPtr), ['nofwd.sender.test']);
    assert.equal(await errorCode(resolver.resolve4('nofwd.sender.test')), 'ENOTFOUND');
  });

  test('127.0.0.2 has no PTR: NXDOMAIN, which node reports as ENOTFOUND', async () => {
    assert.equal(await errorCode(ptr(CLIENTS.noPtr)), 'ENOTFOUND');
  });

  test('the PTR query for 127.0.0.4 times out (ETIMEOUT), a temporary failure', async () => {
    const started = Date.now();
    assert.equal(await errorCode(ptr(CLIENTS.ptrTimeout)), 'ETIMEOUT');
    assert.ok(Date.now() - started >= 900);
  });

  test('an unknown name under .test is NXDOMAIN, not REFUSED', async () => {
    assert.equal(await errorCode(resolver.resolveTxt('nothing-here.test')), 'ENOTFOUND');
  });
});

describe('sender domains', () => {
  test('the DKIM key record comes back whole after the 255-byte split', async () => {
    const expected = testZone().records.txt?.[`${DKIM_SELECTOR}._domainkey.allowed.test`];
    assert.ok(typeof expected === 'string' && expected.length > 255);
    const answer = await resolver.resolveTxt(`${DKIM_SELECTOR}._domainkey.allowed.test`);
    assert.equal(answer.length, 1);
    assert.ok((answer[0]?.length ?? 0) > 1, 'served as several character-strings');
    assert.equal(answer[0]?.join(''), expected);
  });

  test('SPF and DMARC records are served as written', async () => {
    assert.deepEqual(await resolver.resolveTxt('allowed.test'), [['v=spf1 ip4:127.0.0.0/8 -all']]);
    assert.deepEqual(await resolver.resolveTxt('_dmarc.strict.test'), [['v=DMARC1; p=reject']]);
    assert.deepEqual(await resolver.resolveTxt('lax.test'), [['v=spf1 ?all']]);
  });

  test('dnsmasq.conf splits long TXT values and sends timed-out PTRs to a silent server', () => {
    const conf = dnsmasqConf(
      '127.9.9.9',
      { txt: { 'a.test': 'x'.repeat(300) }, ptrTimeout: ['127.0.0.4'] },
      { port: 5353 },
    );
    assert.match(conf, new RegExp(`^txt-record=a\\.test,"${'x'.repeat(255)}","${'x'.repeat(45)}"$`, 'm'));
    assert.match(conf, /^server=\/4\.0\.0\.127\.in-addr\.arpa\/127\.9\.9\.9#5353$/m);
    assert.match(conf, /^local=\/test\/$/m);
  });
});

describe('DKIM signing for the end-to-end suite', () => {
  const message = Buffer.from(
    'From: Sender <s@allowed.test>\r\nTo: box@svc.test\r\nSubject:nospace-after-colon\r\n' +
      'Date: Sat, 21 Nov 2026 10:00:00 +0000\r\nMessage-ID: <dkim-test@allowed.test>\r\n\r\nHello.\r\n',
  );
  const dnsResolver = (name: string, type: string) => resolver.resolve(name, type) as Promise<string[][]>;

  for (const canonicalization of ['relaxed/relaxed', 'simple/simple'] as const) {
    test(`a ${canonicalization} signature verifies and DMARC passes for allowed.test`, async () => {
      const signed = await dkimSignFor('allowed.test', message, canonicalization);
      const result = await authenticate(signed, {
        ip: CLIENTS.good,
        helo: 'mail.sender.test',
        sender: 's@allowed.test',
        mta: 'mx.svc.test',
        resolver: dnsResolver,
        disableArc: true,
        disableBimi: true,
      });
      assert.equal(result.dkim.results[0]?.status.result, 'pass');
      assert.equal(result.dkim.results[0]?.signingDomain, 'allowed.test');
      assert.ok(result.spf && result.dmarc);
      assert.equal(result.spf.status.result, 'pass');
      assert.equal(result.dmarc.status.result, 'pass');
    });
  }

  test('a key of another domain does not verify as allowed.test', async () => {
    const forged = Buffer.from(
      (await dkimSignFor('other.test', message)).toString().replace('d=other.test', 'd=allowed.test'),
    );
    const result = await authenticate(forged, {
      ip: CLIENTS.good,
      sender: 's@allowed.test',
      resolver: dnsResolver,
    });
    assert.notEqual(result.dkim.results[0]?.status.result, 'pass');
  });

  test('strict.test fails DMARC with policy reject', async () => {
    const unsigned = Buffer.from(message.toString().replaceAll('allowed.test', 'strict.test'));
    const result = await authenticate(unsigned, {
      ip: CLIENTS.good,
      sender: 's@strict.test',
      resolver: dnsResolver,
    });
    assert.ok(result.dmarc);
    assert.equal(result.dmarc.status.result, 'fail');
    assert.equal(result.dmarc.policy, 'reject');
  });

  test('signing for a domain without a key throws', async () => {
    await assert.rejects(dkimSignFor('lax.test', message), /lax\.test publishes no DKIM key/);
  });
});
