/**
 * Liveness and readiness: `GET /livez` and `GET /readyz` on the API port (outside /v1 and the OpenAPI
 * document) and on every daemon's metrics port. Ready means the database answers `SELECT 1`.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { DEFAULT_METRICS_PORTS } from '../../src/ops/ops-server.ts';
import { freshDatabase, type TestDatabase } from '../support/database.ts';
import { type DaemonProcess, daemonEnv, startDaemon } from './daemon-process.ts';

/** Nothing listens on port 1 of 127.0.0.1: connecting is refused at once. */
const UNREACHABLE = 'postgres://postgres@127.0.0.1:1/inbox';

let database: TestDatabase;
const daemons: DaemonProcess[] = [];
const start = async (entry: string, env: Record<string, string>) => {
  const daemon = await startDaemon(entry, env);
  daemons.push(daemon);
  return daemon;
};

before(async () => {
  database = await freshDatabase();
});
after(async () => {
  for (const daemon of daemons) daemon.kill();
  await database.drop();
});

async function probe(url: string): Promise<{ status: number; body: unknown }> {
  const response = await fetch(url);
  return { status: response.status, body: await response.json() };
}

test('api: /livez and /readyz answer 200 on the API port and on the metrics port, outside the OpenAPI document', async () => {
  const api = await start('api', daemonEnv(database.url));
  const live = await fetch(`${api.apiUrl}/livez`);
  assert.equal(live.status, 200);
  assert.deepEqual(await live.json(), { ok: true });
  assert.match(live.headers.get('x-request-id') ?? '', /^[0-9a-f-]{36}$/);
  assert.equal(live.headers.get('cache-control'), 'no-store');
  const ready = { status: 200, body: { ok: true, checks: { database: 'ok', clock: 'ok' } } };
  assert.deepEqual(await probe(`${api.apiUrl}/readyz`), ready);
  assert.deepEqual(await probe(`${api.metricsUrl}/readyz`), ready);
  assert.deepEqual(await probe(`${api.metricsUrl}/livez`), { status: 200, body: { ok: true } });
  const document = (await (await fetch(`${api.apiUrl}/v1/openapi.json`)).json()) as { paths: object };
  assert.ok(Object.keys(document.paths).length > 5);
  assert.ok(!Object.keys(document.paths).some((path) => /livez|readyz|metrics/.test(path)));
  assert.equal((await fetch(`${api.apiUrl}/metrics`)).status, 404, 'metrics are not on the API port');
});

test('with the database unreachable: live, not ready (503 naming the check), logged once', async () => {
  const api = await start('api', daemonEnv(UNREACHABLE));
  const lmtp = await start('lmtp', daemonEnv(UNREACHABLE));
  // The clock check keeps its last reading while PostgreSQL is away (none yet: ok).
  const notReady = { status: 503, body: { ok: false, checks: { database: 'unreachable', clock: 'ok' } } };
  for (const url of [api.apiUrl, api.metricsUrl, lmtp.metricsUrl]) {
    assert.deepEqual(await probe(`${url}/livez`), { status: 200, body: { ok: true } }, url);
    assert.deepEqual(await probe(`${url}/readyz`), notReady, url);
  }
  assert.deepEqual(await probe(`${api.apiUrl}/readyz`), notReady);
  const warnings = api.lines.filter((l) => l.msg === 'not ready: the database does not answer');
  assert.equal(warnings.length, 1, 'one line when readiness starts failing, not one per probe');
  assert.equal(warnings[0]?.level, 'warn');
  assert.match(String(warnings[0]?.error), /ECONNREFUSED/);

  // Every API request fails alike meanwhile: one short line for them, not one with a stack each.
  for (let i = 0; i < 20; i++) {
    const response = await fetch(`${api.apiUrl}/v1/inboxes/${'a'.repeat(20)}/messages`, {
      headers: { Authorization: `Bearer rmr_${'b'.repeat(32)}` },
    });
    assert.equal(response.status, 500);
    assert.equal(((await response.json()) as { error: { code: string } }).error.code, 'internal');
  }
  const errors = api.lines.filter((l) => l.level === 'error');
  assert.deepEqual(
    errors.map((l) => [l.msg, l.cause, l.route, l.left_out]),
    [['internal error', 'database unavailable', '/v1/inboxes/:id/messages', 0]],
  );
  assert.match(String(errors[0]?.error), /ECONNREFUSED/);
  assert.doesNotMatch(String(errors[0]?.error), /\n\s+at /, 'no stack');
});

test('policy, milter and jobs serve the probes and /metrics on their own metrics port', async () => {
  for (const entry of ['policy', 'milter', 'jobs']) {
    const daemon = await start(entry, daemonEnv(database.url));
    assert.deepEqual(await probe(`${daemon.metricsUrl}/readyz`), {
      status: 200,
      body: { ok: true, checks: { database: 'ok', clock: 'ok' } },
    });
    const metrics = await fetch(`${daemon.metricsUrl}/metrics`);
    assert.equal(metrics.status, 200);
    assert.match(await metrics.text(), /^# HELP inbox_mail_verdicts_total /m);
    assert.equal((await fetch(`${daemon.metricsUrl}/elsewhere`)).status, 404);
  }
});

test('METRICS_PORT=off serves no metrics; unset, each daemon run alone has a port of its own', async () => {
  const api = await start('api', daemonEnv(database.url, { METRICS_PORT: 'off' }));
  assert.equal(api.metricsUrl, '');
  assert.ok(!api.lines.some((l) => 'metrics' in l));
  assert.equal((await fetch(`${api.apiUrl}/readyz`)).status, 200);
  const separate = ['api', 'policy', 'milter', 'lmtp', 'jobs'].map((entry) => DEFAULT_METRICS_PORTS[entry]);
  assert.equal(new Set(separate).size, 5);
  assert.equal(DEFAULT_METRICS_PORTS.all, 9464);
});
