/**
 * The rendered main.cf and master.cf: every placeholder filled, and Postfix itself (`postconf -n`,
 * `postfix check`) reading back the settings the service relies on (postfix/README.md).
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { promisify } from 'node:util';
import { loadConfig } from '../../src/config/config.ts';
import { DEFAULT_PARALLEL_STORES } from '../../src/core/delivery-service.ts';
import { findPostfix, PostfixInstance, postfixDirs, writeConfigFile } from '../../src/postfix/instance.ts';
import {
  applyOverrides,
  fillTemplate,
  LMTP_ATTEMPT_SECONDS,
  lmtpCacheDestinations,
  postfixEndpoint,
  queueLifetimeSeconds,
  renderPostfix,
} from '../../src/postfix/render.ts';

const run = promisify(execFile);

const config = loadConfig({
  MAIL_DOMAIN: 'svc.test',
  SMTP_PORT: '2525',
  POLICY_PORT: '10040',
  MILTER_PORT: '10041',
  LMTP_PORT: '10042',
});
const unixConfig = loadConfig({
  MAIL_DOMAIN: 'svc.test',
  AUTHSERV_ID: 'mx1.svc.test',
  SMTP_HOST: '0.0.0.0',
  SMTP_PORT: '25',
  POLICY_PORT: '/run/inbox/policy.sock',
  MILTER_PORT: '/run/inbox/milter.sock',
  LMTP_PORT: '/run/inbox/lmtp.sock',
  MAX_MESSAGE_BYTES: '1000000',
});

let base: string;
before(async () => {
  base = await mkdtemp(join(tmpdir(), 'postfix-render-'));
  await chmod(base, 0o755);
});
after(async () => {
  await rm(base, { recursive: true, force: true });
});

/** `postconf -n` of a rendered config, as name → value. */
async function postconfN(
  name: string,
  files: { mainCf: string; masterCf: string },
): Promise<Map<string, string>> {
  const dir = join(base, name);
  await run('mkdir', ['-p', dir]);
  await writeConfigFile(join(dir, 'main.cf'), files.mainCf);
  await writeConfigFile(join(dir, 'master.cf'), files.masterCf);
  const { stdout } = await run('postconf', ['-c', dir, '-n']);
  const lines = stdout.split('\n').filter(Boolean);
  return new Map(
    lines.map((line) => /^(\S+) =(?: (.*))?$/.exec(line)).map((m) => [m?.[1] ?? '', m?.[2] ?? '']),
  );
}

describe('endpoint syntax', () => {
  test('a TCP listener becomes inet:host:port, IPv6 in brackets, a socket path unix:/path', () => {
    assert.equal(postfixEndpoint({ host: '127.0.0.1', port: 10040 }), 'inet:127.0.0.1:10040');
    assert.equal(postfixEndpoint({ host: '::1', port: 10040 }), 'inet:[::1]:10040');
    assert.equal(postfixEndpoint({ path: '/run/inbox/policy.sock' }), 'unix:/run/inbox/policy.sock');
  });

  test('LMTP connection caching names a TCP host without port, and every destination for a socket', () => {
    assert.equal(lmtpCacheDestinations({ host: '127.0.0.1', port: 10042 }), '127.0.0.1');
    assert.equal(lmtpCacheDestinations({ path: '/run/inbox/lmtp.sock' }), 'static:all');
  });
});

describe('renderPostfix', () => {
  const dirs = postfixDirs('/var/lib/inbox/postfix');

  test('fills every placeholder of both templates', () => {
    const files = renderPostfix(config, dirs);
    assert.doesNotMatch(files.mainCf, /\{\{/);
    assert.doesNotMatch(files.masterCf, /\{\{/);
    assert.match(files.masterCf, /^127\.0\.0\.1:2525 inet n {2}- {7}n {7}- {7}- {7}smtpd$/m);
  });

  test('names the placeholders a template leaves unfilled', () => {
    assert.throws(
      () => fillTemplate('main.cf', 'a = {{ONE}}\nb = {{TWO}}\nc = {{ONE}}\n', { TWO: 'x' }),
      /main\.cf: placeholder\(s\) left unfilled: \{\{ONE\}\}$/,
    );
  });

  test('refuses a relative directory and one Postfix would split', () => {
    assert.throws(() => renderPostfix(config, { ...dirs, queueDirectory: 'queue' }), /absolute path/);
    assert.throws(() => renderPostfix(config, { ...dirs, dataDirectory: '/a b' }), /whitespace/);
  });

  test('refuses a RESERVATION_TTL_SECONDS that a message could outlive in the queue', async () => {
    // main.cf's 5d: the default TTL (6 days) outlives it; an override counts too.
    assert.equal(queueLifetimeSeconds(renderPostfix(config, dirs).mainCf), 432_000);
    const short = { ...config, reservationTtlSeconds: 432_000 };
    assert.throws(
      () => renderPostfix(short, dirs),
      /^Error: RESERVATION_TTL_SECONDS: must be at least Postfix's maximal_queue_lifetime \(432000 s\) plus 6100 s/,
    );
    assert.doesNotThrow(() => renderPostfix(short, dirs, { maximal_queue_lifetime: '4d' }));
    // Postfix expires a message only after an attempt fails, and the last attempt may come
    // maximal_backoff_time (4000 s) + queue_run_delay (300 s) after the one before the lifetime, and
    // take up to LMTP_ATTEMPT_SECONDS (1800): until 2026-11-25 an hour was allowed (Postfix review).
    assert.equal(LMTP_ATTEMPT_SECONDS, 1800);
    assert.throws(
      () => renderPostfix({ ...config, reservationTtlSeconds: 432_000 + 6_099 }, dirs),
      /plus 6100 s/,
    );
    assert.doesNotThrow(() => renderPostfix({ ...config, reservationTtlSeconds: 432_000 + 6_100 }, dirs));
    // Overrides of the retry timing count too.
    assert.throws(
      () =>
        renderPostfix({ ...config, reservationTtlSeconds: 432_000 + 6_100 }, dirs, {
          maximal_backoff_time: '2h',
        }),
      /plus 9300 s/,
    );
    assert.throws(() => renderPostfix(config, dirs, { maximal_queue_lifetime: '1w' }), /\(604800 s\)/);
    assert.equal(queueLifetimeSeconds('maximal_queue_lifetime = 3600s\n'), 3600);
    assert.equal(queueLifetimeSeconds('maximal_queue_lifetime = 2\n'), 172_800);
    assert.equal(queueLifetimeSeconds('# none\n'), 432_000);
    assert.throws(() => queueLifetimeSeconds('maximal_queue_lifetime = soon\n'), /not a time value/);
    // What postconf itself reads from the rendered file agrees.
    const n = await postconfN('ttl', renderPostfix(config, dirs));
    assert.equal(n.get('maximal_queue_lifetime'), '5d');
  });

  test('overrides replace a parameter in place, with its continuation lines, or append it', () => {
    const text = 'a = 1\nb = 2\n  continued\nc = 3\n';
    assert.equal(applyOverrides(text, { b: 'x', d: '' }), 'a = 1\nb = x\nc = 3\nd =\n');
    assert.throws(() => applyOverrides(text, { 'bad name': 'x' }), /not a parameter name/);
  });

  test('an IDN mail domain is listed in both forms, as Postfix compares recipients as written', async () => {
    const idn = loadConfig({ MAIL_DOMAIN: 'xn--bcher-kva.example', SMTP_PORT: '2525' });
    const n = await postconfN('idn', renderPostfix(idn, postfixDirs(join(base, 'idn-instance'))));
    assert.equal(n.get('virtual_mailbox_domains'), 'xn--bcher-kva.example, b\u00fccher.example');
    assert.equal(n.get('myhostname'), 'mx.xn--bcher-kva.example');
  });

  test('postconf reads back the settings the service relies on', async () => {
    const n = await postconfN('inet', renderPostfix(config, postfixDirs(join(base, 'inet-instance'))));
    const policy =
      'check_policy_service { inet:127.0.0.1:10040, { default_action = 451 4.3.5 Server configuration problem } }';
    const expected: Record<string, string> = {
      compatibility_level: '3.6',
      myhostname: 'mx.svc.test',
      mydestination: '',
      virtual_mailbox_domains: 'svc.test',
      virtual_transport: 'lmtp:inet:127.0.0.1:10042',
      smtpd_reject_unlisted_recipient: 'no',
      smtpd_delay_reject: 'no',
      smtpd_restriction_classes: 'inbox_unnamed_client',
      inbox_unnamed_client: policy,
      smtpd_client_restrictions: 'check_client_access inline:{unknown=inbox_unnamed_client}',
      smtpd_relay_restrictions: 'reject_unauth_destination',
      smtpd_recipient_restrictions: policy,
      smtpd_recipient_limit: '100',
      smtpd_soft_error_limit: '1000',
      // biome-ignore lint/suspicious/noTemplateCurlyInString: a Postfix expression, not a template
      smtpd_hard_error_limit: '${stress?{1}:{1100}}',
      smtpd_milters: 'inet:127.0.0.1:10041',
      milter_default_action: 'tempfail',
      milter_protocol: '6',
      // Only the queue id, with DATA (postfix/README.md: milter_data_macros).
      milter_connect_macros: '',
      milter_helo_macros: '',
      milter_mail_macros: '',
      milter_rcpt_macros: '',
      milter_data_macros: 'i',
      milter_end_of_header_macros: '',
      milter_end_of_data_macros: '',
      milter_unknown_command_macros: '',
      message_size_limit: String(26214400 + 65536),
      lmtp_send_xforward_command: 'yes',
      lmtp_destination_recipient_limit: String(DEFAULT_PARALLEL_STORES),
      lmtp_connection_cache_destinations: '127.0.0.1',
      enable_long_queue_ids: 'yes',
      default_transport: 'discard:outbound mail disabled',
      relay_transport: 'discard:outbound mail disabled',
      smtpd_forbid_bare_newline: 'normalize',
      smtpd_forbid_bare_newline_exclusions: '',
      inet_interfaces: '127.0.0.1',
      inet_protocols: 'ipv4',
      soft_bounce: 'no',
      maximal_queue_lifetime: '5d',
      bounce_queue_lifetime: '5d',
      queue_directory: join(base, 'inet-instance', 'queue'),
      data_directory: join(base, 'inet-instance', 'data'),
      maillog_file: join(base, 'inet-instance', 'maillog'),
      maillog_file_prefixes: join(base, 'inet-instance'),
    };
    for (const [name, value] of Object.entries(expected)) assert.equal(n.get(name), value, name);
  });

  test('unix sockets, a wildcard SMTP address and a smaller size limit render as Postfix expects', async () => {
    const files = renderPostfix(unixConfig, postfixDirs(join(base, 'unix-instance')), {
      smtpd_recipient_limit: '50',
    });
    const n = await postconfN('unix', files);
    assert.equal(
      n.get('smtpd_recipient_restrictions'),
      'check_policy_service { unix:/run/inbox/policy.sock, { default_action = 451 4.3.5 Server configuration problem } }',
    );
    assert.equal(n.get('smtpd_milters'), 'unix:/run/inbox/milter.sock');
    assert.equal(n.get('virtual_transport'), 'lmtp:unix:/run/inbox/lmtp.sock');
    assert.equal(n.get('lmtp_connection_cache_destinations'), 'static:all');
    assert.equal(n.get('myhostname'), 'mx1.svc.test');
    assert.equal(n.get('inet_interfaces'), 'all');
    assert.equal(n.get('message_size_limit'), '1065536');
    assert.equal(n.get('smtpd_recipient_limit'), '50');
    assert.match(files.masterCf, /^25 inet n/m);
  });
});

describe('postfix check', () => {
  test('accepts both rendered configurations and creates the queue and data directories', async () => {
    assert.equal(findPostfix(), undefined, 'these tests need Postfix installed and root');
    for (const [name, settings] of [
      ['checked-inet', config],
      ['checked-unix', unixConfig],
    ] as const) {
      const instance = new PostfixInstance({
        baseDir: join(base, name),
        render: (d) => renderPostfix(settings, d),
        smtp: { host: '127.0.0.1', port: settings.smtpPort },
      });
      await instance.prepare();
      const { stdout } = await run('stat', [
        '-c',
        '%U',
        instance.dirs.dataDirectory,
        join(instance.dirs.queueDirectory, 'incoming'),
      ]);
      assert.deepEqual(stdout.trim().split('\n'), ['postfix', 'postfix']);
      assert.equal(instance.masterPid(), undefined);
      assert.doesNotMatch(await instance.maillog(), /fatal|warning/);
    }
  });
});
