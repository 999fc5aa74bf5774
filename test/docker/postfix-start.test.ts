/**
 * docker/start/postfix.sh, the Postfix image's entry point, run natively with the environment
 * docker/compose.yaml gives the postfix service: it renders main.cf and master.cf from the
 * environment, `postfix check` accepts them, Postfix reads back the daemons' service addresses, and
 * the master runs in the foreground with the health check following it. Needs root and Postfix, like
 * test/postfix/.
 */
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { findPostfix } from '../../src/postfix/instance.ts';
import { freePort } from '../support/sender-postfix.ts';
import { type Reply, SmtpClient } from '../support/smtp-client.ts';
import { containerEnvironment, loadCompose, REQUIRED_VALUES } from './compose-file.ts';
import { PATH, START, script } from './start-script.ts';

const postconf = async (configDirectory: string, args: string[]): Promise<string> =>
  new Promise((resolve, reject) =>
    execFile('postconf', ['-c', configDirectory, ...args], (error, stdout) =>
      error ? reject(error) : resolve(stdout),
    ),
  );

const compose = loadCompose();
const postfixEnvironment = containerEnvironment(compose.services.postfix ?? {});

let base: string;
before(async () => {
  assert.equal(findPostfix(), undefined, 'these tests need Postfix installed and root');
  base = await mkdtemp(join(tmpdir(), 'docker-start-'));
  await chmod(base, 0o755); // Postfix's daemons must reach the queue below it
});
after(async () => {
  await rm(base, { recursive: true, force: true });
});

interface InstanceDirs {
  POSTFIX_CONFIG_DIRECTORY: string;
  POSTFIX_QUEUE_DIRECTORY: string;
  POSTFIX_DATA_DIRECTORY: string;
  POSTFIX_MAILLOG_FILE: string;
}

function instanceDirs(name: string): InstanceDirs {
  const dir = join(base, name);
  return {
    POSTFIX_CONFIG_DIRECTORY: join(dir, 'etc'),
    POSTFIX_QUEUE_DIRECTORY: join(dir, 'queue'),
    POSTFIX_DATA_DIRECTORY: join(dir, 'data'),
    POSTFIX_MAILLOG_FILE: join(dir, 'maillog'),
  };
}

describe('docker/start/postfix.sh', () => {
  test('renders the compose environment into a configuration Postfix checks and reads back', async () => {
    const dirs = instanceDirs('render');
    const result = await script('postfix.sh', ['render'], { ...postfixEnvironment, ...dirs });
    assert.equal(result.code, 0, result.stderr);
    assert.match(result.stdout, /policy inet:policy:10040, milter inet:milter:10041, lmtp inet:lmtp:10042/);
    const n = await postconf(dirs.POSTFIX_CONFIG_DIRECTORY, ['-n']);
    const policy =
      'check_policy_service { inet:policy:10040, { default_action = 451 4.3.5 Server configuration problem } }';
    for (const line of [
      'smtpd_restriction_classes = inbox_unnamed_client',
      `inbox_unnamed_client = ${policy}`,
      'smtpd_client_restrictions = check_client_access inline:{unknown=inbox_unnamed_client}',
      `smtpd_recipient_restrictions = ${policy}`,
      'smtpd_milters = inet:milter:10041',
      'virtual_transport = lmtp:inet:lmtp:10042',
      'lmtp_connection_cache_destinations = lmtp',
      'lmtp_host_lookup = native',
      'inet_interfaces = all',
      `virtual_mailbox_domains = ${REQUIRED_VALUES.MAIL_DOMAIN}`,
      `myhostname = mx.${REQUIRED_VALUES.MAIL_DOMAIN}`,
      `message_size_limit = ${26214400 + 65536}`,
      `queue_directory = ${dirs.POSTFIX_QUEUE_DIRECTORY}`,
      `maillog_file = ${dirs.POSTFIX_MAILLOG_FILE}`,
    ]) {
      assert.ok(n.split('\n').includes(line), `postconf -n has: ${line}\n${n}`);
    }
    const master = await postconf(dirs.POSTFIX_CONFIG_DIRECTORY, ['-M', '25/inet']);
    assert.match(master, /^25\s+inet\s+n\s+-\s+n\s+-\s+-\s+smtpd$/m, 'smtpd on port 25 of every address');
    // postfix check created the queue, owned as Postfix wants it.
    assert.ok(readdirSync(dirs.POSTFIX_QUEUE_DIRECTORY).includes('maildrop'));
  });

  test('the container default logs to stdout, which Postfix allows as a maillog file', async () => {
    const dirs = { ...instanceDirs('stdout'), POSTFIX_MAILLOG_FILE: '/dev/stdout' };
    const result = await script('postfix.sh', ['render'], { ...postfixEnvironment, ...dirs });
    assert.equal(result.code, 0, result.stderr);
    const n = await postconf(dirs.POSTFIX_CONFIG_DIRECTORY, ['-h', 'maillog_file', 'maillog_file_prefixes']);
    assert.equal(n, '/dev/stdout\n/dev\n');
  });

  test('POSTCONF_<parameter> overrides main.cf, e.g. STARTTLS; a bad name stops with 78', async () => {
    const dirs = instanceDirs('tls');
    const tls = {
      POSTCONF_smtpd_tls_cert_file: '/etc/letsencrypt/live/mx/fullchain.pem',
      POSTCONF_smtpd_tls_key_file: '/etc/letsencrypt/live/mx/privkey.pem',
      POSTCONF_smtpd_tls_security_level: 'may',
    };
    const result = await script('postfix.sh', ['render'], { ...postfixEnvironment, ...dirs, ...tls });
    assert.equal(result.code, 0, result.stderr);
    assert.match(
      result.stdout,
      /overrides: lmtp_host_lookup smtpd_tls_cert_file smtpd_tls_key_file smtpd_tls_security_level/,
    );
    const values = await postconf(dirs.POSTFIX_CONFIG_DIRECTORY, [
      '-h',
      'smtpd_tls_cert_file',
      'smtpd_tls_security_level',
    ]);
    assert.equal(values, '/etc/letsencrypt/live/mx/fullchain.pem\nmay\n');

    const bad = await script('postfix.sh', ['render'], {
      ...postfixEnvironment,
      ...dirs,
      POSTCONF_Smtpd_Banner: 'x',
    });
    assert.equal(bad.code, 78);
    assert.match(
      bad.stderr,
      /configuration error: POSTCONF_Smtpd_Banner: must be POSTCONF_ followed by a lower-case/,
    );
  });

  test('without MAIL_DOMAIN it refuses to render (78), naming the variable', async () => {
    const { MAIL_DOMAIN: _, ...environment } = postfixEnvironment;
    const result = await script('postfix.sh', ['render'], { ...environment, ...instanceDirs('no-domain') });
    assert.equal(result.code, 78);
    assert.match(result.stderr, /^configuration error: MAIL_DOMAIN: is required to render Postfix$/m);
  });

  test('runs the master in the foreground; the health check follows it', async () => {
    const dirs = instanceDirs('run');
    const port = await freePort();
    // Nothing listens at the policy and milter addresses (loopback ports, so no DNS lookup can stall
    // the test).
    const closed = `127.0.0.1:${await freePort()}`;
    const closedMilter = `127.0.0.1:${await freePort()}`;
    const env = {
      ...postfixEnvironment,
      ...dirs,
      SMTP_HOST: '127.0.0.1',
      SMTP_PORT: String(port),
      POLICY_PORT: closed,
      MILTER_PORT: closedMilter,
    };
    const health = (smtpPort = port) =>
      script('postfix-health.sh', [], {
        POSTFIX_CONFIG_DIRECTORY: dirs.POSTFIX_CONFIG_DIRECTORY,
        SMTP_PORT: String(smtpPort),
      });
    const child = spawn(join(START, 'postfix.sh'), [], { env: { PATH, ...env }, stdio: 'ignore' });
    const exited = new Promise<number | null>((resolve) => child.once('exit', resolve));
    try {
      const { client, greeting } = await openWhenListening(port, 15_000);
      const ehlo = await client.command('EHLO client.test');
      const mail = await client.command('MAIL FROM:<a@b.test>');
      client.close();
      // 127.0.0.1 has a verified name (localhost), so Postfix asks the policy service nothing at connect.
      assert.match(greeting.text, /^220 /);
      assert.equal(ehlo.code, 250);
      // No milter answers: Postfix applies milter_default_action, never an unchecked 250.
      assert.match(mail.text, /^451 4\.7\.1 /);
      assert.equal((await health()).code, 0, 'healthy while the master runs and listens');
      // A master whose SMTP port is not listening (bind failed, smtp service gone) is not healthy.
      const idle = await freePort();
      const notListening = await health(idle);
      assert.equal(notListening.code, 1);
      assert.equal(notListening.stderr, `postfix-health: nothing listens on port ${idle}\n`);
    } finally {
      await new Promise((resolve) =>
        execFile('postfix', ['-c', dirs.POSTFIX_CONFIG_DIRECTORY, 'stop'], resolve),
      );
    }
    await exited;
    const stopped = await health();
    assert.equal(stopped.code, 1);
    assert.match(stopped.stderr, /postfix-health: no Postfix master runs/);
  });
});

/** An SMTP session on 127.0.0.1:port with its greeting, retrying until the listener is up. */
async function openWhenListening(
  port: number,
  timeoutMs: number,
): Promise<{ client: SmtpClient; greeting: Reply }> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      return await SmtpClient.open(port);
    } catch (error) {
      if (Date.now() > deadline) throw error;
      await sleep(100);
    }
  }
}
