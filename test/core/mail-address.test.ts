/**
 * mail-address: an SMTP path as the client wrote it, and Postfix's internal form of it, both come out as
 * Postfix itself writes the address to the receiver. The expected column is what Postfix 3.7's LMTP
 * client sent for each MAIL FROM (captured with a line-logging LMTP server in front of `make run`'s
 * configuration, 2026-11-25).
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  domainOf,
  domainsAlign,
  inboxIdOf,
  inMailDomain,
  plainDomain,
  quotedAddress,
  smtpAddress,
} from '../../src/core/mail-address.ts';

// [as the client wrote it, Postfix's internal form (a policy request's sender), as Postfix sent it on]
const FORMS: [string, string, string][] = [
  ['<"john doe"@lax.test>', 'john doe@lax.test', '"john doe"@lax.test'],
  ['<john..doe@lax.test>', 'john..doe@lax.test', '"john..doe"@lax.test'],
  ['<"john"@lax.test>', 'john@lax.test', 'john@lax.test'],
  ['<"a@b"@lax.test>', 'a@b@lax.test', '"a@b"@lax.test'],
  ['<".x"@lax.test>', '.x@lax.test', '".x"@lax.test'],
  ['<"x."@lax.test>', 'x.@lax.test', '"x."@lax.test'],
  ['<"a\\"b"@lax.test>', 'a"b@lax.test', '"a\\"b"@lax.test'],
  ['<@r1,@r2:plain@lax.test>', 'plain@lax.test', 'plain@lax.test'],
  ['<ü@lax.test>', 'ü@lax.test', 'ü@lax.test'],
  ['<"a,b"@lax.test>', 'a,b@lax.test', '"a,b"@lax.test'],
  ['<>', '', ''],
];

// Paths RFC 5321 does not allow but Postfix reads leniently (comments, white space, escapes outside
// quotes): [as written, as Postfix's LMTP client sent it on (captured the same way)].
const LENIENT: [string, string][] = [
  ['<john(comment)@lax.test>', 'john@lax.test'],
  ['<(c)x@lax.test>', 'x@lax.test'],
  ['<x@lax.test(c)>', 'x@lax.test'],
  ['< sp@lax.test>', 'sp@lax.test'],
  ['<x@ lax.test>', 'x@lax.test'],
  ['<"a"@lax.test >', 'a@lax.test'],
  ['<a\\@b@lax.test>', '"a@b"@lax.test'],
  ['<a\\ b@lax.test>', '"a b"@lax.test'],
  ['<\\x@lax.test>', 'x@lax.test'],
  ['<"x\\\\y"@lax.test>', '"x\\\\y"@lax.test'],
  ['<"a"."b"@lax.test>', 'a.b@lax.test'],
  ['<a."b c"@lax.test>', '"a.b c"@lax.test'],
  ['<@[1.2.3.4]:"x y"@lax.test>', '"x y"@lax.test'],
  ['<"x"@[127.0.0.3]>', 'x@[127.0.0.3]'],
];

test('an SMTP path and its internal form both come out as Postfix writes the address', () => {
  for (const [written, internal, expected] of FORMS) {
    assert.equal(smtpAddress(written), expected, written);
    assert.equal(quotedAddress(internal), expected, internal);
  }
  for (const [written, expected] of LENIENT) assert.equal(smtpAddress(written), expected, written);
  assert.equal(smtpAddress('postmaster'), 'postmaster');
});

test('a quoted or source-routed inbox address names the inbox; only MAIL_DOMAIN addresses are ours', () => {
  const id = 'n2dqmseh503y786yqfst';
  for (const written of [
    `<"${id}"@svc.test>`,
    `<@relay.example:${id}@SVC.test>`,
    `"${id.toUpperCase()}"@svc.test`,
  ]) {
    assert.equal(inboxIdOf(smtpAddress(written), 'svc.test'), id, written);
    assert.equal(inMailDomain(smtpAddress(written), 'svc.test'), true, written);
  }
  assert.equal(inMailDomain('postmaster', 'svc.test'), false);
  assert.equal(inMailDomain('a@other.test', 'svc.test'), false);
  // An IDN mail domain in Unicode, as an SMTPUTF8 client may write it; an ASCII one only as written.
  assert.equal(inboxIdOf(`${id}@b\u00fccher.example`, 'xn--bcher-kva.example'), id);
  assert.equal(inboxIdOf(`${id}@B\u00dcCHER.example`, 'xn--bcher-kva.example'), id);
  assert.equal(inboxIdOf(`${id}@xn--bcher-kva.example`, 'xn--bcher-kva.example'), id);
  assert.equal(inMailDomain(`${id}@svc.test.`, 'svc.test'), false);
});

test('a domain is compared as the lists hold it: lowercased, every trailing dot dropped', () => {
  assert.equal(plainDomain('OptOut.Test..'), 'optout.test');
  // An envelope sender's domain, checked against the opt-outs at RCPT.
  assert.equal(domainOf('news@OptOut.Test..'), 'optout.test');
  assert.equal(domainOf('news@optout.test.'), 'optout.test');
  assert.equal(domainOf('news@'), null);
  assert.equal(domainOf('news@.'), null);
  assert.equal(domainOf(''), null);
  // An SMTPUTF8 sender's Unicode domain becomes the xn-- name the lists hold.
  assert.equal(domainOf('x@Bücher.OptOut.Test.'), 'xn--bcher-kva.optout.test');
  assert.equal(domainOf('x@bücher.test'), 'xn--bcher-kva.test');
  assert.equal(domainOf('x@exämple .test'), 'exämple .test');
  assert.ok(domainsAlign('mail.allowed.test', 'allowed.test'));
  assert.ok(domainsAlign('allowed.test', 'news.allowed.test'));
  assert.ok(!domainsAlign('mail.allowed.test', 'news.allowed.test'));
  assert.ok(!domainsAlign('notallowed.test', 'allowed.test'));
});
