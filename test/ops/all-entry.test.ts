/**
 * `node src/main.ts all`, the entry `make run` uses, as its own process with a private Postfix: the API
 * starts last, so once it answers, SMTP already greets (a script that waits for the API and then sends
 * mail is not refused); on SIGTERM Postfix stops first, the process exits 0 and nothing listens.
 */
import assert from 'node:assert/strict';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { freshDatabase, type TestDatabase } from '../support/database.ts';
import { freePorts } from '../support/sender-postfix.ts';
import { SmtpClient } from '../support/smtp-client.ts';
import { type DaemonProcess, daemonEnv, refusedSoon, startDaemon } from './daemon-process.ts';

let database: TestDatabase;
let runDir: string;
let all: DaemonProcess | undefined;

before(async () => {
  database = await freshDatabase();
  runDir = await mkdtemp(join(tmpdir(), 'all-entry-'));
  await chmod(runDir, 0o755); // the postfix user must reach the queue below it
});
after(async () => {
  all?.kill();
  await database.drop();
  await rm(runDir, { recursive: true, force: true });
});

/** The greeting the SMTP server sends on a new connection. */
async function greeting(port: number): Promise<string> {
  const { client, greeting } = await SmtpClient.open(port);
  client.close();
  return greeting.text;
}

test('all: SMTP greets before the API listens; SIGTERM stops Postfix first and exits 0', {
  timeout: 60_000,
}, async () => {
  // Postfix's configuration names the daemons' ports, so they are chosen here, not by the system.
  const [smtp, policy, milter, lmtp] = (await freePorts(4)).map(String) as [string, string, string, string];
  const env = { RUN_DIR: runDir, SMTP_PORT: smtp, POLICY_PORT: policy, MILTER_PORT: milter, LMTP_PORT: lmtp };
  all = await startDaemon('all', daemonEnv(database.url, env));
  const started = all.lines
    .filter((line) => line.msg === 'listening')
    .map((line) => ['policy', 'milter', 'lmtp', 'smtp', 'api', 'metrics'].find((key) => key in line));
  assert.deepEqual(started, ['policy', 'milter', 'lmtp', 'smtp', 'api', 'metrics']);
  assert.match(await greeting(Number(smtp)), /^220 /);
  const response = await fetch(`${all.apiUrl}/readyz`);
  assert.equal(response.status, 200);

  const { code } = await all.terminate();
  assert.equal(code, 0);
  const stopped = all.lines
    .filter((line) => line.msg === 'stopped' && 'name' in line)
    .map((line) => line.name);
  assert.deepEqual(stopped, ['postfix', 'api', 'jobs', 'lmtp', 'milter', 'policy']);
  assert.equal(await refusedSoon(Number(smtp)), true, 'Postfix no longer listens');
  assert.equal(await refusedSoon(Number(new URL(all.apiUrl).port)), true, 'the API no longer listens');
});
