/**
 * Readiness (src/ops/health.ts) against a database that answers, fails, hangs or comes back, and the
 * verdict reasons metrics and log lines use (src/core/smtp-replies.ts).
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { replyReason, smtpReplies } from '../../src/core/smtp-replies.ts';
import { ACCEPT } from '../../src/core/verdict.ts';
import type { LogLine } from '../../src/log.ts';
import { CHECK_TIMEOUT_MS, Health } from '../../src/ops/health.ts';

test('ready while the database answers; a failure is unreachable, logged once, and recovery is logged', async () => {
  let fail = false;
  const lines: LogLine[] = [];
  const health = new Health(
    async () => {
      if (fail) throw new Error('connect ECONNREFUSED 127.0.0.1:5432');
    },
    (line) => lines.push(line),
  );
  assert.deepEqual(await health.ready(), { ok: true, checks: { database: 'ok' } });
  fail = true;
  assert.deepEqual(await health.ready(), { ok: false, checks: { database: 'unreachable' } });
  assert.deepEqual(await health.ready(), { ok: false, checks: { database: 'unreachable' } });
  fail = false;
  assert.equal((await health.ready()).ok, true);
  assert.deepEqual(
    lines.map((l) => [l.level ?? 'info', l.msg]),
    [
      ['warn', 'not ready: the database does not answer'],
      ['info', 'ready again: the database answers'],
    ],
  );
});

test('a database that does not answer is unreachable after the check timeout; probes meanwhile share one ping', async () => {
  let pings = 0;
  const health = new Health(
    () => {
      pings++;
      return new Promise(() => {});
    },
    () => {},
  );
  const began = Date.now();
  const [first, second] = await Promise.all([health.ready(), health.ready()]);
  const took = Date.now() - began;
  assert.equal(first.ok, false);
  assert.deepEqual(second, first);
  assert.ok(took >= CHECK_TIMEOUT_MS - 50 && took < CHECK_TIMEOUT_MS + 500, `took ${took} ms`);
  assert.equal(pings, 1);
});

test('once stopping, not ready whatever the database says', async () => {
  const health = new Health(
    async () => {},
    () => {},
  );
  health.stop();
  assert.equal(health.stopping, true);
  assert.deepEqual(await health.ready(), { ok: false, checks: { process: 'stopping' } });
});

test('a watched part must say ok too; its change is logged once each way', async () => {
  const lines: LogLine[] = [];
  let postfix = 'ok';
  const health = new Health(
    async () => {},
    (line) => lines.push(line),
  );
  health.watch('postfix', () => postfix);
  assert.deepEqual(await health.ready(), { ok: true, checks: { database: 'ok', postfix: 'ok' } });
  postfix = 'not running';
  assert.deepEqual(await health.ready(), { ok: false, checks: { database: 'ok', postfix: 'not running' } });
  assert.equal((await health.ready()).ok, false);
  postfix = 'ok';
  assert.equal((await health.ready()).ok, true);
  assert.deepEqual(
    lines.map((l) => [l.level ?? 'info', l.msg]),
    [
      ['error', 'not ready: postfix not running'],
      ['info', 'ready again: postfix ok'],
    ],
  );
});

test('a verdict is named after its reply in snake_case; accept is accepted; a foreign refusal is other', () => {
  const replies = smtpReplies({ mailDomain: 'svc.test', abuseContact: 'abuse@svc.test' });
  assert.equal(replyReason(replies, ACCEPT), 'accepted');
  assert.equal(replyReason(replies, replies.noSuchInbox), 'no_such_inbox');
  assert.equal(replyReason(replies, { ...replies.quotaExceeded }), 'quota_exceeded');
  assert.equal(replyReason(replies, replies.reverseDnsUnavailable), 'reverse_dns_unavailable');
  assert.equal(replyReason(replies, { kind: 'defer', code: 451, dsn: '4.3.0', text: 'elsewhere' }), 'other');
});
