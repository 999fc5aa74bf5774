/**
 * inboxctl, run as the operator runs it: a child process on Node 24 over the same database as a live
 * API, so every effect is checked through the API (STYLE 18).
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { maintenanceTarget } from '../src/cli/maintenance-target.ts';
import { TOKENS } from '../src/container.ts';
import { INBOX_ID, OWNER_CREDENTIAL, READER_CREDENTIAL } from '../src/core/ids.ts';
import type { ProvisionedInbox } from '../src/core/inbox-service.ts';
import type { Database } from '../src/storage/database.ts';
import { dropDatabase } from './support/database.ts';
import { type Harness, startHarness } from './support/harness.ts';
import { OpenApiValidator } from './support/openapi-validator.ts';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const NODE = fileURLToPath(new URL('../node_modules/.bin/node', import.meta.url));
/** startHarness's default key, so both sides agree on every keyed hash. */
const SECRET_KEY = 'test-secret-key-0123456789abcdefghijklmnop';

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

let h: Harness;
before(async () => {
  h = await startHarness({ MAIL_DOMAIN: 'inbox.test' });
});
after(() => h.close());

function inboxctl(args: string[], env: Record<string, string> = {}): Promise<Run> {
  return cli('src/cli/inboxctl.ts', args, env);
}

function cli(script: string, args: string[], env: Record<string, string> = {}): Promise<Run> {
  return new Promise((resolve) => {
    execFile(
      NODE,
      [script, ...args],
      {
        cwd: ROOT,
        timeout: 30_000,
        env: {
          PATH: process.env.PATH ?? '',
          ENVIRONMENT: 'dev',
          PROVISIONING: 'closed',
          MAIL_DOMAIN: 'inbox.test',
          DATABASE_URL: h.database.url,
          SECRET_KEY,
          ...env,
        },
      },
      (error, stdout, stderr) => {
        const code = error === null ? 0 : typeof error.code === 'number' ? error.code : -1;
        resolve({ code, stdout, stderr });
      },
    );
  });
}

async function create(...domains: string[]): Promise<ProvisionedInbox> {
  const run = await inboxctl(['inbox', 'create', ...domains.flatMap((d) => ['--sender-domain', d])]);
  assert.equal(run.code, 0, run.stderr);
  return JSON.parse(run.stdout) as ProvisionedInbox;
}

test('inbox create while PROVISIONING=closed prints a ProvisionedInbox whose credentials work against the API', async () => {
  const run = await inboxctl([
    'inbox',
    'create',
    '--sender-domain',
    'Example.COM.',
    '--sender-domain=b.example.org',
    '--sender-domain',
    'example.com',
  ]);
  assert.equal(run.code, 0, run.stderr);
  assert.equal(run.stderr, '');
  const document = await (await fetch(`${h.api.baseUrl}/v1/openapi.json`)).json();
  const problems = new OpenApiValidator(document).check(
    'POST',
    '/v1/inboxes',
    201,
    'application/json',
    run.stdout,
  );
  assert.deepEqual(problems, [], 'stdout is the POST /v1/inboxes 201 body');

  const inbox = JSON.parse(run.stdout) as ProvisionedInbox;
  assert.match(inbox.inbox_id, INBOX_ID);
  assert.equal(inbox.address, `${inbox.inbox_id}@inbox.test`);
  assert.match(inbox.credentials.owner, OWNER_CREDENTIAL);
  assert.match(inbox.credentials.reader, READER_CREDENTIAL);
  assert.equal(inbox.quota_bytes, 104857600);
  assert.equal(Date.parse(inbox.expires_at) - Date.parse(inbox.created_at), 3600_000);
  assert.deepEqual(inbox.sender_domains, ['b.example.org', 'example.com']);

  const status = await h.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.owner });
  assert.equal(status.status, 200);
  assert.equal(status.json.state, 'live');
  assert.equal(status.json.expires_at, inbox.expires_at);
  assert.deepEqual(status.json.sender_domains, ['b.example.org', 'example.com']);
  const asReader = await h.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.reader });
  assert.equal(asReader.status, 200);
  // An owner-only operation proves the printed owner credential is the owner's.
  const changed = await h.api.put(`/v1/inboxes/${inbox.inbox_id}/sender-domains`, {
    token: inbox.credentials.owner,
    body: { sender_domains: [] },
  });
  assert.equal(changed.status, 200);
  assert.deepEqual(changed.json.sender_domains, []);
});

test('inbox create without --sender-domain makes an inbox that takes any sender', async () => {
  const inbox = await create();
  assert.deepEqual(inbox.sender_domains, []);
});

test('inbox create naming an opted-out domain, or a subdomain of one, fails with exit 1 and prints no inbox', async () => {
  assert.equal((await inboxctl(['optout', 'add', 'refused.example'])).code, 0);
  for (const domain of ['refused.example', 'Mail.Refused.Example.']) {
    const run = await inboxctl([
      'inbox',
      'create',
      '--sender-domain',
      'fine.example',
      '--sender-domain',
      domain,
    ]);
    assert.equal(run.code, 1);
    assert.equal(run.stdout, '');
    assert.match(run.stderr, /opted out/);
    assert.match(run.stderr, new RegExp(domain.toLowerCase().replace(/\.$/, '').replaceAll('.', '\\.')));
    assert.doesNotMatch(run.stderr, /fine\.example/);
  }
});

test('inbox cancel makes both credentials answer 410 inbox_cancelled', async () => {
  const inbox = await create();
  const run = await inboxctl(['inbox', 'cancel', inbox.inbox_id]);
  assert.equal(run.code, 0, run.stderr);
  assert.match(run.stdout, new RegExp(inbox.inbox_id));
  for (const token of [inbox.credentials.owner, inbox.credentials.reader]) {
    const status = await h.api.get(`/v1/inboxes/${inbox.inbox_id}`, { token });
    assert.equal(status.status, 410);
    assert.equal(status.json.error.code, 'inbox_cancelled');
    assert.equal(status.json.error.details.reason, 'abuse');
  }
  assert.equal(run.stdout.trim(), `cancelled inbox ${inbox.inbox_id}`);
  const again = await inboxctl(['inbox', 'cancel', inbox.inbox_id]);
  assert.equal(again.code, 0, 'cancelling twice is harmless');
  // and says so (ops review: it said "cancelled" again, even past expires_at)
  assert.equal(again.stdout.trim(), `inbox ${inbox.inbox_id} was already cancelled`);
});

test('inbox cancel of an expired inbox fails with exit 1 and leaves it expired, not purged', async () => {
  const inbox = await create();
  // inboxctl runs on the real clock: the inbox expired a minute ago.
  const db = h.container.resolve<Database>(TOKENS.Database);
  await db.pool.query(`UPDATE inboxes SET expires_at = now() - interval '1 minute' WHERE inbox_id = $1`, [
    inbox.inbox_id,
  ]);
  const run = await inboxctl(['inbox', 'cancel', inbox.inbox_id]);
  assert.equal(run.code, 1);
  assert.equal(run.stdout, '');
  assert.equal(run.stderr, `inboxctl: inbox ${inbox.inbox_id} has expired: nothing to cancel\n`);
  const { rows } = await db.pool.query('SELECT cancelled_at FROM inboxes WHERE inbox_id = $1', [
    inbox.inbox_id,
  ]);
  assert.deepEqual(rows, [{ cancelled_at: null }]);
});

test('inbox cancel of an id no inbox has fails with exit 1 naming the id', async () => {
  const run = await inboxctl(['inbox', 'cancel', '0123456789abcdefghjk']);
  assert.equal(run.code, 1);
  assert.equal(run.stdout, '');
  assert.equal(run.stderr, 'inboxctl: no such inbox: 0123456789abcdefghjk\n');
});

test('optout add, list and remove round trip, and an opt-out makes POST /v1/inboxes answer 409 sender_opted_out', async () => {
  const added = await inboxctl(['optout', 'add', 'Blocked.Example.']);
  assert.equal(added.code, 0, added.stderr);
  const list = await inboxctl(['optout', 'list']);
  assert.equal(list.code, 0);
  assert.ok(list.stdout.split('\n').includes('blocked.example'), list.stdout);
  const json = await inboxctl(['optout', 'list', '--json']);
  const entries = JSON.parse(json.stdout) as { domain: string; created_at: string }[];
  const entry = entries.find((e) => e.domain === 'blocked.example');
  assert.ok(entry && !Number.isNaN(Date.parse(entry.created_at)), json.stdout);

  const refused = await h.api.post('/v1/inboxes', { body: { sender_domains: ['news.blocked.example'] } });
  assert.equal(refused.status, 409);
  assert.equal(refused.json.error.code, 'sender_opted_out');
  assert.deepEqual(refused.json.error.details.domains, ['news.blocked.example']);

  const twice = await inboxctl(['optout', 'add', 'blocked.example']);
  assert.equal(twice.code, 0, 'adding an existing opt-out is harmless');
  assert.match(twice.stdout, /already/);

  const removed = await inboxctl(['optout', 'remove', 'BLOCKED.example']);
  assert.equal(removed.code, 0, removed.stderr);
  assert.ok(!(await inboxctl(['optout', 'list'])).stdout.split('\n').includes('blocked.example'));
  const accepted = await h.api.post('/v1/inboxes', { body: { sender_domains: ['news.blocked.example'] } });
  assert.equal(accepted.status, 201);

  const gone = await inboxctl(['optout', 'remove', 'blocked.example']);
  assert.equal(gone.code, 1);
  assert.match(gone.stderr, /blocked\.example is not opted out/);
});

test('every bad argument exits 64 with a one-line message and a usage hint on stderr', async () => {
  const cases: string[][] = [
    ['bogus'],
    ['--verbose'],
    ['-x'],
    ['migrate', 'now'],
    ['inbox'],
    ['inbox', 'delete'],
    ['inbox', 'create', 'extra'],
    ['inbox', 'create', '--sender-domain'],
    ['inbox', 'create', '--sender-domain', '--json'],
    ['inbox', 'create', '--sender-domain', 'not a domain'],
    ['inbox', 'create', '--sender-domain=localhost'],
    ['inbox', 'create', '--json'],
    ['inbox', 'create', ...Array.from({ length: 21 }, (_, i) => `--sender-domain=d${i}.example`)],
    ['inbox', 'cancel'],
    ['inbox', 'cancel', 'not-an-inbox-id'],
    ['inbox', 'cancel', '0123456789ABCDEFGHJK'],
    ['inbox', 'cancel', '0123456789abcdefghjk', 'extra'],
    ['optout'],
    ['optout', 'block', 'a.example'],
    ['optout', 'add'],
    ['optout', 'add', 'localhost'],
    ['optout', 'add', 'bad-.example'],
    ['optout', 'add', 'a.example', 'b.example'],
    ['optout', 'add', 'a.example', '--json'],
    ['optout', 'remove'],
    ['optout', 'remove', 'under_score.example'],
    ['optout', 'list', 'extra'],
    ['optout', 'list', '--json=yes'],
  ];
  const runs = await Promise.all(cases.map((args) => inboxctl(args)));
  runs.forEach((run, i) => {
    const label = JSON.stringify(cases[i]);
    assert.equal(run.code, 64, `${label}: ${run.stderr}`);
    assert.equal(run.stdout, '', label);
    const lines = run.stderr.split('\n');
    assert.equal(lines.length, 3, `${label}: ${run.stderr}`);
    assert.match(lines[0] as string, /^inboxctl: \S/, label);
    assert.equal(lines[1], 'run "inboxctl --help" for usage', label);
  });
});

test('no arguments prints the usage on stderr and exits 64; --help prints it on stdout and exits 0', async () => {
  const bare = await inboxctl([]);
  assert.equal(bare.code, 64);
  assert.match(bare.stderr, /^usage: inboxctl/);
  for (const args of [['--help'], ['-h'], ['inbox', 'create', '--help']]) {
    const help = await inboxctl(args);
    assert.equal(help.code, 0);
    assert.equal(help.stderr, '');
    for (const command of [
      'migrate',
      'inbox create',
      'inbox cancel',
      'optout add',
      'optout remove',
      'optout list',
    ]) {
      assert.ok(help.stdout.includes(command), `usage names ${command}`);
    }
  }
});

test('bad arguments are reported before the configuration is read', async () => {
  const run = await inboxctl(['bogus'], { API_PORT: 'abc' });
  assert.equal(run.code, 64);
});

test('a bad configuration value exits 78 naming the variable', async () => {
  const run = await inboxctl(['optout', 'list'], { API_PORT: 'abc' });
  assert.equal(run.code, 78);
  assert.match(run.stderr, /^configuration error: API_PORT: /);
  const short = await inboxctl(['optout', 'list'], { SECRET_KEY: 'too-short' });
  assert.equal(short.code, 78);
  assert.match(short.stderr, /^configuration error: SECRET_KEY: /);
});

test('an unreachable database exits 1 with a one-line message, migrate too', async () => {
  // migrate goes through knex, which wrote its own "Acquire connection error" and a stack first (ops review).
  for (const args of [['optout', 'list'], ['migrate']]) {
    const run = await inboxctl(args, { DATABASE_URL: 'postgres://postgres@127.0.0.1:1/nowhere' });
    assert.equal(run.code, 1, args.join(' '));
    assert.match(run.stderr, /^inboxctl: .*ECONNREFUSED.*\n$/, args.join(' '));
    assert.equal(run.stdout, '', args.join(' '));
  }
});

test('migrate on an already-migrated database succeeds and applies nothing', async () => {
  const run = await inboxctl(['migrate']);
  assert.equal(run.code, 0, run.stderr);
  assert.equal(run.stdout, 'database is up to date\n');
});

test('ensure-database creates the database DATABASE_URL names, once; a malformed URL exits 78 naming it', async () => {
  const name = `inbox_test_ensure_${randomBytes(4).toString('hex')}`;
  const url = new URL(h.database.url);
  url.pathname = `/${name}`;
  try {
    const first = await cli('src/cli/ensure-database.ts', [], { DATABASE_URL: url.toString() });
    assert.equal(first.code, 0, first.stderr);
    assert.equal(first.stdout, `created database ${name}\n`);
    const again = await cli('src/cli/ensure-database.ts', [], { DATABASE_URL: url.toString() });
    assert.deepEqual([again.code, again.stdout], [0, '']);
  } finally {
    await dropDatabase(name);
  }
  const bad = await cli('src/cli/ensure-database.ts', [], { DATABASE_URL: 'postgres://u:pa#ss@db/inbox' });
  assert.equal(bad.code, 78);
  assert.match(bad.stderr, /configuration error: DATABASE_URL: is not a valid URL/);
  assert.doesNotMatch(bad.stderr, /pa#ss/);
});

test('ensure-database reads every DATABASE_URL form the README lists: the database, and the same server for postgres', () => {
  const forms: [string, Record<string, unknown>][] = [
    [
      'postgres://u:p%23w@db.example:6543/inbox',
      { host: 'db.example', port: 6543, user: 'u', password: 'p#w' },
    ],
    ['socket:/var/run/postgresql?db=inbox&user=u', { host: '/var/run/postgresql', user: 'u' }],
    ['postgres://u@/inbox?host=/var/run/postgresql', { host: '/var/run/postgresql', user: 'u' }],
    ['/var/run/postgresql inbox', { host: '/var/run/postgresql' }],
  ];
  for (const [url, server] of forms) {
    const { name, maintenance } = maintenanceTarget(url);
    assert.equal(name, 'inbox', url);
    assert.equal(maintenance.database, 'postgres', url);
    for (const [key, value] of Object.entries(server))
      assert.equal(maintenance[key as keyof typeof maintenance], value, `${url}: ${key}`);
  }
  assert.equal(maintenanceTarget('postgres://u@db.example').name, undefined);
});
