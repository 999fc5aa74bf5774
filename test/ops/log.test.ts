/**
 * The log (src/log.ts): one JSON object per line from pino, in the shape every daemon shares, with
 * levels filtered and credential-named fields redacted whoever passes them.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { createLog, type LogLevel } from '../../src/log.ts';

function capture(level?: LogLevel) {
  const written: string[] = [];
  const log = createLog('lmtp', (text) => written.push(text), level);
  const lines = () => written.map((text) => JSON.parse(text) as Record<string, unknown>);
  return { log, written, lines };
}

test('a line is one JSON object: level label, ISO time, daemon, pid, the fields, msg; newline-ended', () => {
  const { log, written, lines } = capture();
  log({ msg: 'delivery', queue_id: '4ZxY1', inbox_ids: ['a'], stored: 1 });
  assert.equal(written.length, 1);
  const text = written[0] ?? '';
  assert.ok(text.endsWith('}\n'));
  assert.equal(text.indexOf('\n'), text.length - 1, 'one line');
  const [line] = lines();
  assert.deepEqual(Object.keys(line ?? {}), [
    'level',
    'time',
    'daemon',
    'pid',
    'queue_id',
    'inbox_ids',
    'stored',
    'msg',
  ]);
  assert.equal(line?.level, 'info');
  assert.match(String(line?.time), /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
  assert.equal(line?.daemon, 'lmtp');
  assert.equal(line?.pid, process.pid);
  assert.equal(line?.msg, 'delivery');
});

test('the level field picks the level; below LOG_LEVEL nothing is written; an unknown level is info', () => {
  const info = capture();
  info.log({ level: 'debug', msg: 'probe' });
  info.log({ level: 'warn', msg: 'slow' });
  info.log({ level: 'shout', msg: 'odd' });
  assert.deepEqual(
    info.lines().map((l) => [l.level, l.msg]),
    [
      ['warn', 'slow'],
      ['info', 'odd'],
    ],
  );
  const warn = capture('warn');
  warn.log({ msg: 'request' });
  warn.log({ level: 'error', msg: 'failed' });
  assert.deepEqual(
    warn.lines().map((l) => l.msg),
    ['failed'],
  );
  const debug = capture('debug');
  debug.log({ level: 'debug', msg: 'probe' });
  assert.equal(debug.lines()[0]?.level, 'debug');
});

test('fields named like a credential, and credential headers, are redacted whoever passes them', () => {
  const { log, written, lines } = capture();
  log({
    msg: 'oops',
    authorization: 'Bearer rmo_secret1',
    token: 'rmr_secret2',
    secret_key: 'k'.repeat(32),
    credentials: { owner: 'rmo_secret3', reader: 'rmr_secret4' },
    password: 'hunter2',
    headers: { host: 'api.example.com', authorization: 'Bearer rmo_secret5', cookie: 'sid=secret6' },
  });
  const text = written.join('');
  for (const secret of [
    'rmo_secret1',
    'rmr_secret2',
    'k'.repeat(32),
    'rmo_secret3',
    'rmr_secret4',
    'hunter2',
  ]) {
    assert.ok(!text.includes(secret), secret);
  }
  for (const secret of ['rmo_secret5', 'secret6']) assert.ok(!text.includes(secret), secret);
  const [line] = lines();
  assert.equal(line?.authorization, '[redacted]');
  assert.equal(line?.credentials, '[redacted]');
  assert.deepEqual(line?.headers, {
    host: 'api.example.com',
    authorization: '[redacted]',
    cookie: '[redacted]',
  });
});
