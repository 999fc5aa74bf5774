/**
 * SIGTERM, sent to each daemon run as its own process (`node src/main.ts <entry>`) while it has work in
 * flight: it stops accepting at once, finishes that work within SHUTDOWN_GRACE_SECONDS, answers it,
 * and exits 0. Work still unfinished at the end of the grace is cut off with a temporary failure
 * (LMTP: 421), never a lost or half-stored message.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import net from 'node:net';
import { after, afterEach, before, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { LmtpClient } from '../lmtp/lmtp-client.ts';
import { envelope, MtaClient, show } from '../milter/mta-client.ts';
import { freshDatabase, type TestDatabase } from '../support/database.ts';
import {
  type DaemonProcess,
  daemonEnv,
  exitsWithin,
  MAIL_DOMAIN,
  provisionInbox,
  refusedSoon,
  startDaemon,
} from './daemon-process.ts';
import { type HeldDns, startHeldDns } from './held-dns.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
let database: TestDatabase;
let db: pg.Client;
const daemons: DaemonProcess[] = [];
const start = async (entry: string, env: Record<string, string> = {}) => {
  const daemon = await startDaemon(entry, daemonEnv(database.url, env));
  daemons.push(daemon);
  return daemon;
};
const isStopping = (line: Record<string, unknown>) => line.msg === 'stopping';

before(async () => {
  database = await freshDatabase();
  db = new pg.Client({ connectionString: database.url });
  await db.connect();
});
afterEach(() => {
  for (const daemon of daemons.splice(0)) daemon.kill();
});
after(async () => {
  await db.end();
  await database.drop();
});

/** A raw HTTP/1.1 connection, to hold a request half sent. */
async function httpConnection(url: string) {
  const { port } = new URL(url);
  const socket = net.connect(Number(port), '127.0.0.1');
  await once(socket, 'connect');
  let received = '';
  socket.setEncoding('latin1');
  socket.on('data', (text: string) => {
    received += text;
  });
  return {
    socket,
    port: Number(port),
    received: () => received,
    closed: once(socket, 'close'),
    async until(pattern: RegExp) {
      for (let i = 0; i < 200 && !pattern.test(received); i++) await sleep(10);
      assert.match(received, pattern);
    },
  };
}

test('api: a request in flight at SIGTERM is answered (Connection: close), new connections are refused, exit 0', async (t) => {
  const api = await start('api');
  const http = await httpConnection(api.apiUrl);
  http.socket.write('GET /livez HTTP/1.1\r\nHost: ops\r\n\r\n');
  await http.until(/\{"ok":true\}/);
  http.socket.write(
    'POST /v1/inboxes HTTP/1.1\r\nHost: ops\r\nContent-Type: application/json\r\nContent-Length: 2\r\n' +
      'X-Request-Id: in-flight-1\r\n\r\n{',
  );
  await sleep(200);
  const stopped = api.terminate();
  await api.waitForLine(isStopping);
  assert.equal(await refusedSoon(http.port), true, 'the listener is closed');
  assert.equal(await exitsWithin(api, 300), false, 'the process waits for the request in flight');

  const sent = performance.now();
  http.socket.write('}');
  await http.closed;
  const second = http.received().slice(http.received().indexOf('HTTP/1.1 201'));
  assert.match(second, /^HTTP\/1\.1 201 Created\r\n/);
  assert.match(second, /\r\nConnection: close\r\n/i);
  assert.match(second, /\r\nX-Request-Id: in-flight-1\r\n/i);
  assert.match(second, /"inbox_id":"[0-9a-z]{20}"/);
  const { code, ms } = await stopped;
  assert.equal(code, 0);
  const after = Math.round(performance.now() - sent);
  assert.ok(after < 2000, 'exits soon after the last response');
  t.diagnostic(`exit 0 ${ms} ms after SIGTERM, ${after} ms after the request's last byte`);
  assert.ok(api.lines.some((l) => l.msg === 'request' && l.request_id === 'in-flight-1' && l.status === 201));
});

test('api: a request still unfinished when the grace ends is cut off, and the process exits 0', async (t) => {
  const api = await start('api', { SHUTDOWN_GRACE_SECONDS: '1' });
  const http = await httpConnection(api.apiUrl);
  http.socket.write(
    'POST /v1/inboxes HTTP/1.1\r\nHost: ops\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{',
  );
  await sleep(200);
  const { code, ms } = await api.terminate();
  await http.closed;
  assert.equal(code, 0);
  assert.ok(ms >= 900 && ms < 4000, `exited after ${ms} ms`);
  assert.equal(http.received(), '', 'no response for a request whose body never came');
  t.diagnostic(`exit 0 ${ms} ms after SIGTERM (grace 1 s)`);
});

test('api: a second SIGTERM while a request is in flight ends the process at once, status 1', async (t) => {
  const api = await start('api');
  const http = await httpConnection(api.apiUrl);
  http.socket.write(
    'POST /v1/inboxes HTTP/1.1\r\nHost: ops\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{',
  );
  await sleep(200);
  api.child.kill('SIGTERM');
  await api.waitForLine(isStopping);
  const began = performance.now();
  api.child.kill('SIGTERM');
  assert.equal(await api.exited, 1);
  const ms = Math.round(performance.now() - began);
  assert.ok(ms < 1000, `exited ${ms} ms after the second signal`);
  assert.ok(api.lines.some((l) => l.msg === 'second signal; exiting now'));
  t.diagnostic(`exit 1 ${ms} ms after the second SIGTERM`);
});

async function lmtpTransaction(port: number, inboxId: string, ident: string): Promise<LmtpClient> {
  const client = await LmtpClient.connect({ port });
  assert.match(await client.command('LHLO postfix.test'), /^250 /);
  assert.match(await client.command(`XFORWARD PROTO=ESMTP HELO=mail.sender.test IDENT=${ident}`), /^250 /);
  assert.match(await client.command('MAIL FROM:<sender@example.com>'), /^250 /);
  assert.match(await client.command(`RCPT TO:<${inboxId}@${MAIL_DOMAIN}>`), /^250 /);
  assert.match(await client.command('DATA'), /^354 /);
  await client.write('Subject: half a message\r\n\r\nthe first half\r\n');
  return client;
}

const storedWithQueueId = async (queueId: string) =>
  (await db.query("SELECT 1 FROM messages WHERE queue_id = $1 AND state = 'stored'", [queueId])).rowCount;

test('lmtp: a delivery in flight at SIGTERM is stored and answered 250, then 421; exit 0', async (t) => {
  const inbox = await provisionInbox(database.url);
  const lmtp = await start('lmtp');
  const client = await lmtpTransaction(lmtp.port, inbox.inbox_id, 'OPSQ1');
  const stopped = lmtp.terminate();
  await lmtp.waitForLine(isStopping);
  assert.equal(await refusedSoon(lmtp.port), true, 'the listener is closed');
  assert.equal(await exitsWithin(lmtp, 300), false, 'the process waits for the delivery in flight');

  const sent = performance.now();
  await client.write('the second half\r\n.\r\n');
  assert.match((await client.reply()).join('\n'), /^250 2\.0\.0 msg_\w+ stored$/);
  assert.match((await client.reply()).join('\n'), /^421 /);
  const { code, ms } = await stopped;
  assert.equal(code, 0);
  t.diagnostic(
    `exit 0 ${ms} ms after SIGTERM, ${Math.round(performance.now() - sent)} ms after the final dot`,
  );
  assert.equal(await storedWithQueueId('OPSQ1'), 1);
  assert.ok(lmtp.lines.some((l) => l.msg === 'delivery' && l.queue_id === 'OPSQ1' && l.stored === 1));
});

test('lmtp: a delivery unfinished when the grace ends gets 421 (not a cut connection) and nothing is stored', async (t) => {
  const inbox = await provisionInbox(database.url);
  const lmtp = await start('lmtp', { SHUTDOWN_GRACE_SECONDS: '1' });
  const client = await lmtpTransaction(lmtp.port, inbox.inbox_id, 'OPSQ2');
  const { code, ms } = await lmtp.terminate();
  assert.match(
    (await client.reply()).join('\n'),
    /^421 4\.3\.2 mx\.ops\.test shutting down, try again later$/,
  );
  assert.equal(code, 0);
  assert.ok(ms >= 900 && ms < 5000, `exited after ${ms} ms`);
  assert.equal(await storedWithQueueId('OPSQ2'), 0);
  t.diagnostic(`421, exit 0 ${ms} ms after SIGTERM (grace 1 s)`);
});

async function heldDns(): Promise<HeldDns> {
  const dns = await startHeldDns();
  after(() => dns.close());
  return dns;
}

test('policy: a decision in flight at SIGTERM is answered, then the connection ends; readiness is 503 meanwhile; exit 0', async (t) => {
  const dns = await heldDns();
  const policy = await start('policy', { REQUIRE_PTR: 'true', DNS_SERVERS: dns.address });
  const socket = net.connect(policy.port, '127.0.0.1');
  await once(socket, 'connect');
  let received = '';
  socket.setEncoding('latin1');
  socket.on('data', (text: string) => {
    received += text;
  });
  const closed = once(socket, 'close');
  socket.write(
    'request=smtpd_access_policy\nprotocol_state=CONNECT\nclient_address=127.0.0.9\n' +
      'client_name=unknown\nreverse_client_name=unknown\n\n',
  );
  await dns.queried();
  const stopped = policy.terminate();
  await policy.waitForLine(isStopping);
  assert.equal(await refusedSoon(policy.port), true, 'the listener is closed');
  const ready = await fetch(`${policy.metricsUrl}/readyz`);
  assert.equal(ready.status, 503);
  assert.deepEqual(await ready.json(), { ok: false, checks: { process: 'stopping' } });
  assert.equal((await fetch(`${policy.metricsUrl}/livez`)).status, 200);
  assert.equal(received, '', 'no reply before the decision');

  const released = performance.now();
  dns.release();
  await closed;
  assert.equal(received, 'action=550 5.7.25 Sender IP reverse lookup rejected\n\n');
  const { code, ms } = await stopped;
  assert.equal(code, 0);
  t.diagnostic(
    `exit 0 ${ms} ms after SIGTERM, ${Math.round(performance.now() - released)} ms after DNS answered`,
  );
});

test('milter: an end-of-message verdict in flight at SIGTERM is sent, then the connection ends; exit 0', async (t) => {
  const inbox = await provisionInbox(database.url);
  const dns = await heldDns();
  const milter = await start('milter', { DNS_SERVERS: dns.address });
  const mta = await MtaClient.connect(milter.address);
  await mta.negotiate();
  const rcpt = `<${inbox.inbox_id}@${MAIL_DOMAIN}>`;
  await envelope(mta, '<someone@sender.test>', [rcpt]);
  mta.macros('T', { i: 'OPSM1' });
  mta.data();
  assert.equal(show(await mta.read()), 'c');
  mta.macros('L', { i: 'OPSM1' });
  mta.header('From', ' someone@sender.test');
  mta.macros('N', { i: 'OPSM1' });
  mta.eoh();
  assert.equal(show(await mta.read()), 'c');
  mta.body('hello\r\n');
  mta.macros('E', { i: 'OPSM1' });
  mta.eob();
  await dns.queried();
  const stopped = milter.terminate();
  await milter.waitForLine(isStopping);
  assert.equal(await refusedSoon(Number(milter.address.split(':').pop())), true);
  assert.deepEqual(await mta.pending(200), [], 'no verdict before the lookups are answered');

  const released = performance.now();
  dns.release();
  const replies: string[] = [];
  for (let reply = ''; reply !== 'c'; ) {
    reply = show(await mta.read(5000));
    replies.push(reply);
  }
  assert.match(replies[0] ?? '', /^i\0\0\0\0Authentication-Results\0/);
  await mta.closed;
  const { code, ms } = await stopped;
  assert.equal(code, 0);
  t.diagnostic(
    `exit 0 ${ms} ms after SIGTERM, ${Math.round(performance.now() - released)} ms after DNS answered`,
  );
  assert.ok(
    milter.lines.some((l) => l.msg === 'milter verdict' && l.queue_id === 'OPSM1' && l.verdict === 'accept'),
  );
});

test('jobs: a batch in flight at SIGTERM commits, the job stops before its next batch; exit 0', async (t) => {
  await db.query(
    `INSERT INTO provision_idempotency (key_hash, request_hash, sealed_response, created_at)
     SELECT decode(md5(i::text), 'hex'), '\\x00', '\\x00', now() - interval '2 days' FROM generate_series(1, 3) i`,
  );
  const locker = new pg.Client({ connectionString: database.url });
  await locker.connect();
  try {
    await locker.query('BEGIN');
    await locker.query('LOCK TABLE provision_idempotency IN ACCESS EXCLUSIVE MODE');
    const jobs = await start('jobs', { SWEEP_INTERVAL_SECONDS: '1', SWEEP_BATCH_SIZE: '1' });
    for (let i = 0; ; i++) {
      const waiting = await db.query(
        `SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%provision_idempotency%'
           AND pid <> pg_backend_pid()`,
      );
      if (waiting.rowCount) break;
      assert.ok(i < 100, 'the job never reached provision_idempotency');
      await sleep(50);
    }
    const stopped = jobs.terminate();
    await jobs.waitForLine(isStopping);
    assert.equal(await exitsWithin(jobs, 300), false, 'the process waits for the batch in flight');
    const released = performance.now();
    await locker.query('COMMIT');
    const { code, ms } = await stopped;
    assert.equal(code, 0);
    t.diagnostic(
      `exit 0 ${ms} ms after SIGTERM, ${Math.round(performance.now() - released)} ms after the lock was released`,
    );
    const left = await db.query('SELECT count(*)::int AS n FROM provision_idempotency');
    assert.equal(left.rows[0].n, 2, 'one batch of one row, then the job stopped');
    const ran = jobs.lines.find((l) => l.msg === 'job ran' && l.job === 'forget-idempotency');
    assert.equal(ran?.keys, 1);
    assert.equal(ran?.complete, false);
  } finally {
    await locker.end();
  }
});

test('a SIGTERM while start-up hangs (a database that accepts and never answers) still exits within the grace plus 10 s', {
  timeout: 40_000,
}, async () => {
  const silent = net.createServer(); // accepts, never answers
  const reached = once(silent, 'connection');
  silent.listen(0, '127.0.0.1');
  await once(silent, 'listening');
  const port = (silent.address() as net.AddressInfo).port;
  try {
    const env = daemonEnv(`postgres://postgres@127.0.0.1:${port}/x`, { SHUTDOWN_GRACE_SECONDS: '1' });
    const child = spawn(process.execPath, ['src/main.ts', 'policy'], { cwd: ROOT, env, stdio: 'pipe' });
    let output = '';
    child.stdout.on('data', (data: Buffer) => {
      output += data.toString();
    });
    const exited = new Promise<number | null>((resolve) => child.once('exit', resolve));
    // Start-up hangs from its first connection to the database on (the signal handlers come before it;
    // a fixed 2 s wait could signal a process still loading on a busy machine, before them).
    await reached;
    child.kill('SIGTERM');
    const began = Date.now();
    const code = await Promise.race([exited, sleep(20_000).then(() => 'hung' as const)]);
    if (code === 'hung') child.kill('SIGKILL');
    // Until 2026-11-25 the stop waited for the hung start step, with no limit.
    assert.notEqual(code, 'hung', output);
    assert.ok(Date.now() - began < 1000 + 10_000 + 2000, `${Date.now() - began} ms`);
    assert.match(output, /"msg":"stopping"/);
  } finally {
    silent.close();
  }
});
