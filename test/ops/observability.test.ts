/**
 * Metrics and logs after real traffic through the daemons run as their own processes: an inbox
 * provisioned, read and downloaded over the API; policy requests over the policy socket; a message
 * through the milter and delivered over LMTP; a lifecycle job deleting rows. Each process's /metrics
 * shows its counters moved; its log lines carry request ids, queue ids and inbox ids, and never a
 * credential, the secret key or a word of the message.
 */
import assert from 'node:assert/strict';
import { once } from 'node:events';
import net from 'node:net';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import type { ProvisionedInbox } from '../../src/core/inbox-service.ts';
import { deliverRaw } from '../lmtp/lmtp-client.ts';
import { envelope, MtaClient, show } from '../milter/mta-client.ts';
import { freshDatabase, type TestDatabase } from '../support/database.ts';
import {
  type DaemonProcess,
  daemonEnv,
  MAIL_DOMAIN,
  type Scrape,
  SECRET_KEY,
  scrape,
  startDaemon,
} from './daemon-process.ts';
import { startHeldDns } from './held-dns.ts';

const BODY_MARKER = 'zebra-quartz-body-7731';
const SUBJECT_MARKER = 'walrus-subject-4410';
const MESSAGE =
  `From: someone@sender.test\r\nTo: x@${MAIL_DOMAIN}\r\nSubject: your code ${SUBJECT_MARKER}\r\n` +
  `Message-ID: <ops-1@sender.test>\r\n\r\nYour code is ${BODY_MARKER}.\r\n`;
const WRONG_TOKEN = 'rmr_thisisnotacredentialofanyinbox0000';

let database: TestDatabase;
const daemons: Record<'api' | 'policy' | 'milter' | 'lmtp', DaemonProcess> = {} as never;
const before_: Partial<Record<keyof typeof daemons, Scrape>> = {};
const after_: Partial<Record<keyof typeof daemons, Scrape>> = {};
let inbox: ProvisionedInbox;
const responses: Record<string, Response> = {};
const policyReplies: string[] = [];
const milterReplies: string[] = [];
const tooLargeReplies: string[] = [];
let lmtpReplies: string[] = [];
let downloaded = '';

async function policyRequests(port: number, requests: Record<string, string>[]): Promise<string[]> {
  const socket = net.connect(port, '127.0.0.1');
  await once(socket, 'connect');
  let received = '';
  socket.setEncoding('latin1');
  socket.on('data', (text: string) => {
    received += text;
  });
  const replies: string[] = [];
  for (const request of requests) {
    const attributes = { request: 'smtpd_access_policy', ...request };
    socket.write(
      `${Object.entries(attributes)
        .map(([k, v]) => `${k}=${v}\n`)
        .join('')}\n`,
    );
    while (!received.includes('\n\n')) await once(socket, 'data');
    const end = received.indexOf('\n\n');
    replies.push(received.slice(0, end));
    received = received.slice(end + 2);
  }
  socket.destroy();
  return replies;
}

before(async () => {
  database = await freshDatabase();
  const dns = await startHeldDns();
  dns.release();
  after(() => dns.close());
  const env = daemonEnv(database.url, { DNS_SERVERS: dns.address });
  await Promise.all(
    (['api', 'policy', 'milter', 'lmtp'] as const).map(async (entry) => {
      daemons[entry] = await startDaemon(entry, env);
    }),
  );
  for (const entry of ['api', 'policy', 'milter', 'lmtp'] as const) {
    before_[entry] = await scrape(daemons[entry].metricsUrl);
  }

  const api = daemons.api.apiUrl;
  responses.provision = await fetch(`${api}/v1/inboxes`, {
    method: 'POST',
    headers: { 'X-Request-Id': 'ops-provision-1', 'Idempotency-Key': 'ops-provision-key' },
    body: '{}',
  });
  inbox = (await responses.provision.json()) as ProvisionedInbox;
  const owner = { Authorization: `Bearer ${inbox.credentials.owner}` };
  const reader = { Authorization: `Bearer ${inbox.credentials.reader}` };
  responses.status = await fetch(`${api}/v1/inboxes/${inbox.inbox_id}`, {
    headers: { ...owner, 'X-Request-Id': 'not a sane id!' },
  });
  responses.wrong = await fetch(`${api}/v1/inboxes/${inbox.inbox_id}`, {
    headers: { Authorization: `Bearer ${WRONG_TOKEN}` },
  });

  const address = `${inbox.inbox_id}@${MAIL_DOMAIN}`;
  policyReplies.push(
    ...(await policyRequests(daemons.policy.port, [
      {
        protocol_state: 'RCPT',
        instance: 'a.1',
        client_address: '127.0.0.3',
        sender: 's@sender.test',
        recipient: address,
      },
      {
        protocol_state: 'RCPT',
        instance: 'a.1',
        client_address: '127.0.0.3',
        sender: 's@sender.test',
        recipient: `aaaaaaaaaaaaaaaaaaaa@${MAIL_DOMAIN}`,
      },
    ])),
  );

  const mta = await MtaClient.connect(daemons.milter.address);
  await mta.negotiate();
  await envelope(mta, '<someone@sender.test>', [`<${address}>`]);
  mta.macros('T', { i: 'OPSQUEUE1' });
  mta.data();
  assert.equal(show(await mta.read()), 'c');
  const [head = '', body = ''] = MESSAGE.split('\r\n\r\n');
  for (const field of head.split('\r\n')) {
    const colon = field.indexOf(':');
    mta.macros('L', { i: 'OPSQUEUE1' });
    mta.header(field.slice(0, colon), field.slice(colon + 1));
  }
  mta.macros('N', { i: 'OPSQUEUE1' });
  mta.eoh();
  milterReplies.push(show(await mta.read()));
  mta.body(body);
  mta.macros('E', { i: 'OPSQUEUE1' });
  mta.eob();
  for (let reply = ''; reply !== 'c' && !reply.startsWith('y') && reply !== 't'; ) {
    reply = show(await mta.read(5000));
    milterReplies.push(reply);
  }
  // A second message, refused by the milter itself (a header field too large): counted and logged
  // like any verdict (until 2026-11-25 neither).
  await envelope(mta, '<someone@sender.test>', [`<${address}>`]);
  mta.macros('T', { i: 'OPSQUEUE2' });
  mta.data();
  assert.equal(show(await mta.read()), 'c');
  mta.macros('L', { i: 'OPSQUEUE2' });
  mta.header('X-Big', ` ${'b'.repeat(54_100)}`);
  mta.macros('N', { i: 'OPSQUEUE2' });
  mta.eoh();
  tooLargeReplies.push(show(await mta.read()));
  mta.macros('E', { i: 'OPSQUEUE2' });
  mta.eob();
  tooLargeReplies.push(show(await mta.read(5000)));
  mta.close();

  lmtpReplies = (
    await deliverRaw(
      { port: daemons.lmtp.port },
      { ident: 'OPSQUEUE1', from: 'someone@sender.test', to: [address], body: MESSAGE },
    )
  ).replies;

  const poll = await fetch(`${api}/v1/inboxes/${inbox.inbox_id}/messages`, { headers: reader });
  const listed = (await poll.json()) as { messages: { url: string }[] };
  // PUBLIC_BASE_URL is http://127.0.0.1:0 here (API_PORT=0): keep only the path.
  const download = await fetch(`${api}${new URL(listed.messages[0]?.url ?? '').pathname}`, {
    headers: reader,
  });
  downloaded = await download.text();

  for (const entry of ['api', 'policy', 'milter', 'lmtp'] as const) {
    after_[entry] = await scrape(daemons[entry].metricsUrl);
  }
});

after(async () => {
  for (const daemon of Object.values(daemons)) daemon.kill();
  await database.drop();
});

test('the traffic went through (so the assertions below are about real work)', () => {
  assert.equal(responses.provision?.status, 201);
  assert.equal(responses.status?.status, 200);
  assert.equal(responses.wrong?.status, 401);
  assert.deepEqual(policyReplies, ['action=DUNNO', `action=555 5.7.1 ${MAIL_DOMAIN}: no such inbox`]);
  assert.equal(milterReplies.at(-1), 'c');
  assert.match(lmtpReplies.join('\n'), /^250 2\.0\.0 msg_\w+ stored$/);
  assert.match(downloaded, new RegExp(BODY_MARKER));
});

describe('metrics', () => {
  const moved = (entry: keyof typeof daemons, name: string, labels: Record<string, string> = {}) =>
    (after_[entry]?.(name, labels) ?? 0) - (before_[entry]?.(name, labels) ?? 0);

  test('api: requests by route template and status, their latency, and the database pool', () => {
    assert.equal(
      moved('api', 'inbox_http_requests_total', { method: 'POST', route: '/v1/inboxes', status: '201' }),
      1,
    );
    assert.equal(
      moved('api', 'inbox_http_requests_total', { method: 'GET', route: '/v1/inboxes/:id', status: '200' }),
      1,
    );
    assert.equal(
      moved('api', 'inbox_http_requests_total', { method: 'GET', route: '/v1/inboxes/:id', status: '401' }),
      1,
    );
    assert.equal(
      moved('api', 'inbox_http_requests_total', {
        method: 'GET',
        route: '/v1/inboxes/:id/messages/:msg',
        status: '200',
      }),
      1,
    );
    assert.equal(
      moved('api', 'inbox_http_request_seconds_count', { method: 'POST', route: '/v1/inboxes' }),
      1,
    );
    const api = after_.api as Scrape;
    assert.ok(api('inbox_db_pool_connections', { state: 'total' }) >= 1);
    assert.equal(api('inbox_db_pool_max'), 10);
    assert.equal(api('inbox_db_pool_waiting'), 0);
    assert.ok(api('process_resident_memory_bytes') > 0, "prom-client's process metrics are there");
  });

  test('policy: verdicts by stage, kind and reason, and the decision latency', () => {
    const verdicts = (verdict: string, reason: string) =>
      moved('policy', 'inbox_mail_verdicts_total', { daemon: 'policy', stage: 'rcpt', verdict, reason });
    assert.equal(verdicts('accept', 'accepted'), 1);
    assert.equal(verdicts('reject', 'no_such_inbox'), 1);
    assert.equal(moved('policy', 'inbox_policy_decision_seconds_count', { stage: 'rcpt' }), 2);
  });

  test('milter: the end-of-message verdict and its latency', () => {
    assert.equal(
      moved('milter', 'inbox_mail_verdicts_total', {
        daemon: 'milter',
        stage: 'end_of_message',
        verdict: 'accept',
        reason: 'accepted',
      }),
      1,
    );
    assert.equal(moved('milter', 'inbox_milter_decision_seconds_count'), 1);
    assert.deepEqual(
      tooLargeReplies.map((r) => r.slice(0, 10)),
      ['y552 5.3.4', 'y552 5.3.4'],
    );
    assert.equal(
      moved('milter', 'inbox_mail_verdicts_total', {
        daemon: 'milter',
        stage: 'end_of_message',
        verdict: 'reject',
        reason: 'header_too_large',
      }),
      1,
    );
    assert.ok(
      daemons.milter.lines.some(
        (l) => l.msg === 'milter verdict' && l.queue_id === 'OPSQUEUE2' && l.reply === '552 5.3.4',
      ),
    );
  });

  test('lmtp: outcomes per recipient, store latency and bytes received', () => {
    assert.equal(
      moved('lmtp', 'inbox_mail_verdicts_total', {
        daemon: 'lmtp',
        stage: 'delivery',
        verdict: 'accept',
        reason: 'stored',
      }),
      1,
    );
    assert.equal(moved('lmtp', 'inbox_lmtp_store_seconds_count'), 1);
    assert.equal(moved('lmtp', 'inbox_lmtp_message_bytes_sum'), Buffer.byteLength(MESSAGE));
  });

  test('jobs: runs by outcome and rows deleted', async () => {
    const client = new pg.Client({ connectionString: database.url });
    await client.connect();
    await client.query(`UPDATE provision_idempotency SET created_at = now() - interval '2 days'`);
    await client.end();
    const jobs = await startDaemon(
      'jobs',
      daemonEnv(database.url, { SWEEP_INTERVAL_SECONDS: '1', IDEMPOTENCY_TTL_SECONDS: '60' }),
    );
    try {
      await jobs.waitForLine((l) => l.msg === 'job ran' && l.job === 'forget-idempotency', 10_000);
      const metrics = await scrape(jobs.metricsUrl);
      assert.ok(metrics('inbox_job_runs_total', { job: 'forget-idempotency', outcome: 'complete' }) >= 1);
      assert.equal(metrics('inbox_job_rows_total', { job: 'forget-idempotency', what: 'keys' }), 1);
      assert.ok(metrics('inbox_job_seconds_count', { job: 'expire-inboxes' }) >= 1);
    } finally {
      jobs.kill();
    }
  });
});

describe('logs', () => {
  const all = () => Object.values(daemons).flatMap((d) => d.lines);
  const output = () =>
    Object.values(daemons)
      .map((d) => d.output())
      .join('');

  test('every line is one JSON object with level, time, daemon and msg', () => {
    assert.ok(all().length > 8);
    for (const line of all()) {
      assert.ok(['debug', 'info', 'warn', 'error'].includes(line.level as string), JSON.stringify(line));
      assert.match(line.time as string, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
      assert.ok(['api', 'policy', 'milter', 'lmtp'].includes(line.daemon as string), JSON.stringify(line));
      assert.equal(typeof line.msg, 'string');
    }
  });

  test('api: a sane X-Request-Id is kept, any other is replaced; the access log carries it and the inbox id', () => {
    assert.equal(responses.provision?.headers.get('x-request-id'), 'ops-provision-1');
    const replaced = responses.status?.headers.get('x-request-id') ?? '';
    assert.match(replaced, /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/);
    const lines = daemons.api.lines.filter((l) => l.msg === 'request');
    assert.ok(
      lines.some((l) => l.request_id === 'ops-provision-1' && l.route === '/v1/inboxes' && l.status === 201),
    );
    assert.ok(
      lines.some(
        (l) =>
          l.request_id === replaced &&
          l.route === '/v1/inboxes/:id' &&
          l.inbox_id === inbox.inbox_id &&
          l.status === 200,
      ),
    );
  });

  test('mail side: queue ids and inbox ids on the milter, LMTP and policy lines', () => {
    assert.ok(
      daemons.milter.lines.some(
        (l) =>
          l.msg === 'milter verdict' &&
          l.queue_id === 'OPSQUEUE1' &&
          JSON.stringify(l.inbox_ids) === JSON.stringify([inbox.inbox_id]) &&
          l.reason === 'accepted',
      ),
    );
    assert.ok(
      daemons.lmtp.lines.some(
        (l) =>
          l.msg === 'delivery' &&
          l.queue_id === 'OPSQUEUE1' &&
          JSON.stringify(l.inbox_ids) === JSON.stringify([inbox.inbox_id]) &&
          l.stored === 1,
      ),
    );
    assert.ok(
      daemons.policy.lines.some(
        (l) =>
          l.msg === 'policy refusal' && l.reason === 'no_such_inbox' && l.inbox_id === 'aaaaaaaaaaaaaaaaaaaa',
      ),
    );
  });

  test('no credential, no secret key and no message content appears in any output', () => {
    const text = output();
    for (const secret of [inbox.credentials.owner, inbox.credentials.reader, WRONG_TOKEN, SECRET_KEY]) {
      assert.ok(!text.includes(secret), `a secret is in the logs: ${secret.slice(0, 6)}...`);
    }
    for (const content of [BODY_MARKER, SUBJECT_MARKER, 'ops-provision-key']) {
      assert.ok(!text.includes(content), `"${content}" is in the logs`);
    }
  });
});
