/**
 * docker/start/app.sh, the service image's entry point, run natively with the environments
 * docker/compose.yaml gives the services: it waits for a database that appears late, migrates it,
 * starts the API and the policy daemon (each passing its compose health check, each stopping with 0
 * on SIGTERM), gives up on an unreachable database in one line, and stops on a bad configuration
 * before waiting.
 */
import assert from 'node:assert/strict';
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { ADMIN_URL, databaseUrl, dropDatabase } from '../support/database.ts';
import { freePort } from '../support/sender-postfix.ts';
import { containerEnvironment, loadCompose, REPO } from './compose-file.ts';
import { PATH, START, script } from './start-script.ts';

const compose = loadCompose();

describe('docker/start/app.sh', () => {
  const name = `inbox_docker_${process.pid}_${Date.now().toString(36)}`;
  const url = databaseUrl(name);
  /** A service's environment from compose, against this test's database, on free loopback ports. */
  const environmentOf = async (
    service: string,
  ): Promise<Record<string, string> & { METRICS_PORT: string }> => ({
    ...containerEnvironment(compose.services[service] ?? {}),
    DATABASE_URL: url,
    METRICS_HOST: '127.0.0.1',
    METRICS_PORT: String(await freePort()),
  });
  const apiEnvironment = async (): Promise<
    Record<string, string> & { API_PORT: string; METRICS_PORT: string }
  > => ({
    ...(await environmentOf('api')),
    API_HOST: '127.0.0.1',
    API_PORT: String(await freePort()),
  });
  /** Runs a service's compose health check with its port swapped for the test's; resolves the exit code. */
  const healthcheck = (service: string, fromPort: string, toPort: string): Promise<number> => {
    const [, program, ...args] = (compose.services[service]?.healthcheck?.test ?? []) as string[];
    const swapped = args.map((arg) => arg.replace(`:${fromPort}/`, `:${toPort}/`));
    assert.notDeepEqual(swapped, args, `${service}: the health check names port ${fromPort}`);
    return new Promise((resolve) =>
      execFile(program as string, swapped, { cwd: REPO, env: { PATH } }, (error) =>
        resolve(error ? Number(error.code ?? 1) : 0),
      ),
    );
  };
  /** Starts a start script in the background, collecting its output. */
  const background = (args: string[], env: Record<string, string>) => {
    const child: ChildProcess = spawn(join(START, 'app.sh'), args, {
      env: { PATH, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const output = { text: '' };
    child.stdout?.on('data', (chunk) => {
      output.text += chunk;
    });
    child.stderr?.on('data', (chunk) => {
      output.text += chunk;
    });
    const exited = new Promise<number | null>((resolve) => child.once('exit', resolve));
    return { child, output, exited };
  };
  /** Polls until the URL answers 200 (or gives up after 10 s). */
  const answered = async (target: string): Promise<Response | undefined> => {
    for (let i = 0; i < 100; i++) {
      const response = await fetch(target).catch(() => undefined);
      if (response?.status === 200) return response;
      await sleep(100);
    }
    return undefined;
  };
  const admin = async (sql: string) => {
    const client = new pg.Client({ connectionString: ADMIN_URL });
    await client.connect();
    try {
      await client.query(sql);
    } finally {
      await client.end();
    }
  };
  after(() => dropDatabase(name));

  test('waits for the database, then migrates it', async () => {
    const env = { ...(await apiEnvironment()), WAIT_FOR_DATABASE_SECONDS: '30' };
    // The database does not exist yet: the script must wait for it rather than fail. It is created once
    // the script says it waits (after a fixed delay, a slow start on a busy machine never had to).
    const migrating = background(['migrate'], env);
    for (let i = 0; i < 200 && !/^probe: waiting/m.test(migrating.output.text); i++) await sleep(100);
    assert.match(migrating.output.text, /^probe: waiting up to 30 s for database$/m);
    await admin(`CREATE DATABASE ${name}`);
    assert.equal(await migrating.exited, 0, migrating.output.text);
    const migrated = migrating.output.text
      .split('\n')
      .filter((line) => line.startsWith('{'))
      .map((line) => JSON.parse(line) as { msg: string; applied?: string[] })
      .find((line) => line.msg === 'migrated');
    const expected = readdirSync(join(REPO, 'migrations'))
      .filter((f) => f.endsWith('.ts'))
      .sort();
    assert.deepEqual(migrated?.applied, expected);
  });

  test('starts the API, which answers /v1/health and the compose health check, and stops on SIGTERM', async () => {
    const env = await apiEnvironment();
    const api = background(['api'], env);
    try {
      const response = await answered(`http://127.0.0.1:${env.API_PORT}/v1/health`);
      assert.ok(response, `the API answered: ${api.output.text}`);
      assert.deepEqual(await response.json(), { ok: true, environment: 'prod' });
      assert.equal(await healthcheck('api', '8080', env.API_PORT), 0, 'the compose health check passes');
    } finally {
      api.child.kill('SIGTERM');
    }
    assert.equal(await api.exited, 0, api.output.text);
    assert.match(api.output.text, /"msg":"stopped"/);
    assert.equal(await healthcheck('api', '8080', env.API_PORT), 1, 'and fails once it has stopped');
  });

  test('starts the policy daemon on every interface, ready by the compose health check', async () => {
    const env = { ...(await environmentOf('policy')) };
    const port = await freePort();
    assert.equal(env.POLICY_PORT, '0.0.0.0:10040');
    const policy = background(['policy'], { ...env, POLICY_PORT: `0.0.0.0:${port}` });
    try {
      assert.ok(await answered(`http://127.0.0.1:${env.METRICS_PORT}/readyz`), policy.output.text);
      assert.equal(await healthcheck('policy', '9464', env.METRICS_PORT), 0);
      assert.match(policy.output.text, new RegExp(`"policy":"inet:0\\.0\\.0\\.0:${port}"`));
    } finally {
      policy.child.kill('SIGTERM');
    }
    assert.equal(await policy.exited, 0, policy.output.text);
  });

  test('gives up on an unreachable database after WAIT_FOR_DATABASE_SECONDS, saying so in one line', async () => {
    const port = await freePort();
    const result = await script('app.sh', ['api'], {
      ...(await apiEnvironment()),
      DATABASE_URL: `postgres://inbox:secret@127.0.0.1:${port}/inbox`,
      WAIT_FOR_DATABASE_SECONDS: '1',
    });
    assert.equal(result.code, 1);
    assert.match(result.stderr, /^probe: database is not reachable after 1 s: .*ECONNREFUSED/m);
    assert.doesNotMatch(result.stderr, /secret/, 'the connection string is not printed');
  });

  test('a bad configuration stops before waiting (78); `all` is refused (64)', async () => {
    const bad = await script('app.sh', ['api'], { ...(await apiEnvironment()), SECRET_KEY: 'short' });
    assert.equal(bad.code, 78);
    assert.match(bad.stderr, /configuration error: SECRET_KEY: must be at least 32 characters/);
    const all = await script('app.sh', ['all'], await apiEnvironment());
    assert.equal(all.code, 64);
    assert.match(all.stderr, /'all' needs Postfix on the same host/);
  });
});
