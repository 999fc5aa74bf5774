/**
 * `node src/main.ts all`, the entry `make run` uses, as its own process with a private Postfix: the API
 * starts last, so once it answers, SMTP already greets (a script that waits for the API and then sends
 * mail is not refused); on SIGTERM Postfix stops first, the process exits 0 and nothing listens.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { chmod, glob, mkdtemp, readFile, rm } from 'node:fs/promises';
import { type AddressInfo, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { freshDatabase, type TestDatabase } from '../support/database.ts';
import { freePorts } from '../support/sender-postfix.ts';
import { SmtpClient } from '../support/smtp-client.ts';
import { type DaemonProcess, daemonEnv, exitsWithin, refusedSoon, startDaemon } from './daemon-process.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
let database: TestDatabase;
let runDir: string;
let all: DaemonProcess | undefined;

before(async () => {
  database = await freshDatabase();
  runDir = await mkdtemp(join(tmpdir(), 'all-entry-'));
  await chmod(runDir, 0o755); // the postfix user must reach the queue below it
});
after(async () => {
  // SIGTERM first: `all` stops its Postfix; a master left by a test that failed half-way (or by a
  // SIGKILLed `all`) is a daemon of its own and would outlive this file.
  if (all && !(await exitsWithin(all, 0))) await all.terminate();
  for await (const pidFile of glob(join(runDir, '**/postfix/queue/pid/master.pid'))) {
    const pid = Number((await readFile(pidFile, 'utf8').catch(() => '')).trim());
    const command = await readFile(`/proc/${pid}/comm`, 'utf8').catch(() => '');
    if (pid > 0 && command.trim() === 'master') process.kill(pid, 'SIGKILL');
  }
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
  assert.deepEqual(((await response.json()) as { checks: unknown }).checks, {
    database: 'ok',
    clock: 'ok',
    postfix: 'ok',
  });

  const { code } = await all.terminate();
  assert.equal(code, 0);
  const stopped = all.lines
    .filter((line) => line.msg === 'stopped' && 'name' in line)
    .map((line) => line.name);
  // Postfix first; then the daemons together, each within the one grace.
  assert.equal(stopped[0], 'postfix');
  assert.deepEqual(stopped.slice(1).sort(), ['api', 'jobs', 'lmtp', 'milter', 'policy']);
  assert.equal(await refusedSoon(Number(smtp)), true, 'Postfix no longer listens');
  assert.equal(await refusedSoon(Number(new URL(all.apiUrl).port)), true, 'the API no longer listens');
});

/** RCPT's reply for an address no inbox has: the policy daemon's 555 once Postfix reaches it. */
async function rcptToNoInbox(port: number): Promise<string> {
  const { client } = await SmtpClient.open(port);
  try {
    await client.command('EHLO client.test');
    await client.command('MAIL FROM:<a@example.org>');
    return (await client.command(`RCPT TO:<0123456789abcdefghjk@ops.test>`)).text;
  } finally {
    client.close();
  }
}

test('all: daemons on port 0 are named to Postfix by the ports they bound; a second all on the same RUN_DIR is refused, the first serves on', {
  timeout: 90_000,
}, async () => {
  const dir = join(runDir, 'shared');
  const [smtp, otherSmtp] = (await freePorts(2)).map(String) as [string, string];
  // daemonEnv's POLICY_PORT, MILTER_PORT and LMTP_PORT are 0. Until 2026-11-25 Postfix was told port 0
  // and answered every RCPT 451 4.3.5.
  const first = await startDaemon('all', daemonEnv(database.url, { RUN_DIR: dir, SMTP_PORT: smtp }));
  try {
    assert.match(await rcptToNoInbox(Number(smtp)), /^555 5\.7\.1 .*no such inbox/);
    // Another make run of this checkout, on other ports: until 2026-11-25 it stopped the first one's
    // Postfix (the first still answered /readyz), and each one's Ctrl-C stopped the other's.
    const second = await startDaemon(
      'all',
      daemonEnv(database.url, { RUN_DIR: dir, SMTP_PORT: otherSmtp }),
    ).catch((error: Error) => error);
    assert.ok(second instanceof Error, 'the second all must not start');
    assert.match(second.message, new RegExp(`in use by another "all" process \\(pid ${first.child.pid}`));
    assert.match(await greeting(Number(smtp)), /^220 /);
    assert.equal(await refusedSoon(Number(otherSmtp)), true);
    // A master that dies makes the process not ready (it answered ready with no SMTP listener).
    const master = Number((await readFile(join(dir, 'postfix/queue/pid/master.pid'), 'utf8')).trim());
    process.kill(master, 'SIGKILL');
    let ready = await fetch(`${first.apiUrl}/readyz`);
    for (let i = 0; i < 100 && ready.status === 200; i++) {
      await new Promise((resolve) => setTimeout(resolve, 50));
      ready = await fetch(`${first.apiUrl}/readyz`);
    }
    assert.equal(ready.status, 503);
    assert.deepEqual(await ready.json(), {
      ok: false,
      checks: { database: 'ok', clock: 'ok', postfix: 'not running' },
    });
  } finally {
    assert.equal((await first.terminate()).code, 0);
  }
  // Its lock went with it: the next run starts.
  const again = await startDaemon('all', daemonEnv(database.url, { RUN_DIR: dir, SMTP_PORT: smtp }));
  assert.equal((await again.terminate()).code, 0);
});

test('all: a start that fails after Postfix started stops Postfix and the daemons, then exits 1', {
  timeout: 60_000,
}, async () => {
  const [smtp] = (await freePorts(1)).map(String) as [string];
  const taken = createServer();
  await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', resolve));
  const apiPort = String((taken.address() as AddressInfo).port);
  try {
    const env = daemonEnv(database.url, {
      RUN_DIR: join(runDir, 'failing'),
      SMTP_PORT: smtp,
      API_PORT: apiPort,
    });
    const failed = await startDaemon('all', env).catch((error: Error) => error);
    assert.ok(failed instanceof Error, 'all must not start with its API port taken');
    assert.match(failed.message, /EADDRINUSE/);
    assert.match(failed.message, /"name":"postfix","ms":\d+,"msg":"stopped"/);
    // Until 2026-11-25 the master stayed, greeting on SMTP_PORT and tempfailing every sender.
    assert.equal(await refusedSoon(Number(smtp)), true, 'no Postfix is left listening');
  } finally {
    taken.close();
  }
});

test('all: SIGTERM while Postfix starts stops it and everything else, and exits 0', {
  timeout: 60_000,
}, async () => {
  const [smtp] = (await freePorts(1)).map(String) as [string];
  const dir = join(runDir, 'signalled');
  const env = daemonEnv(database.url, { RUN_DIR: dir, SMTP_PORT: smtp });
  const child = spawn(process.execPath, ['src/main.ts', 'all'], { cwd: ROOT, env, stdio: 'pipe' });
  let output = '';
  child.stdout.on('data', (data: Buffer) => {
    output += data.toString();
  });
  child.stderr.on('data', (data: Buffer) => {
    output += data.toString();
  });
  const exited = new Promise<number | null>((resolve) => child.once('exit', resolve));
  // The master's pid file appears while `postfix start` runs, before start() has seen the greeting.
  const pidFile = join(dir, 'postfix/queue/pid/master.pid');
  while (!existsSync(pidFile)) await new Promise((resolve) => setTimeout(resolve, 2));
  child.kill('SIGTERM');
  assert.equal(await exited, 0, output);
  // Until 2026-11-25 the process stopped the daemons it knew of and exited, and the master started
  // meanwhile stayed, tempfailing every sender.
  assert.equal(await refusedSoon(Number(smtp)), true, `no Postfix is left listening:\n${output}`);
  assert.match(output, /"name":"postfix","ms":\d+,"msg":"stopped"/);
});
