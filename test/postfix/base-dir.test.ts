/**
 * Where the service's own Postfix lives (src/postfix/base-dir.ts): under RUN_DIR when the postfix user
 * can reach it, else outside it with RUN_DIR/postfix a link, as for a checkout under /root (0700).
 * The last test prepares a real instance that way and lets `postfix check` create its queue. Needs root.
 */
import assert from 'node:assert/strict';
import { chmod, lstat, mkdir, mkdtemp, readlink, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, before, test } from 'node:test';
import { loadConfig } from '../../src/config/config.ts';
import { linkTo, postfixBase, unsearchableAbove } from '../../src/postfix/base-dir.ts';
import { findPostfix, PostfixInstance } from '../../src/postfix/instance.ts';

let base: string;

before(async () => {
  base = await mkdtemp(join(tmpdir(), 'postfix-base-'));
  await chmod(base, 0o755);
});

after(async () => {
  await rm(base, { recursive: true, force: true });
});

/** A directory of the given mode under base, as a home directory would be. */
async function home(name: string, mode: number): Promise<string> {
  const dir = join(base, name);
  await mkdir(dir);
  await chmod(dir, mode);
  return dir;
}

test('RUN_DIR/postfix is used when every directory above it is searchable by others', async () => {
  const open = await home('open', 0o755);
  assert.equal(unsearchableAbove(join(open, 'checkout', '.run')), undefined);
  assert.deepEqual(postfixBase(join(open, 'checkout', '.run'), join(base, 'fallback')), {
    dir: join(open, 'checkout', '.run', 'postfix'),
  });
});

test('under a 0700 directory it moves out, to a directory named after RUN_DIR, the same each time', async () => {
  const closed = await home('closed', 0o700);
  const runDir = join(closed, 'checkout', '.run');
  assert.equal(unsearchableAbove(runDir), closed);
  const first = postfixBase(runDir, join(base, 'fallback'));
  assert.match(first.dir, new RegExp(`^${join(base, 'fallback')}/postfix-[0-9a-f]{12}$`));
  assert.equal(first.moved?.from, join(runDir, 'postfix'));
  assert.match(first.moved?.because ?? '', /not searchable by the postfix user/);
  assert.deepEqual(postfixBase(`${runDir}/`, join(base, 'fallback')), first);
  assert.notEqual(postfixBase(join(closed, 'other', '.run'), join(base, 'fallback')).dir, first.dir);
});

test('linkTo makes the link, repoints a stale one, replaces an empty tree, and leaves anything else', async () => {
  const dir = await home('links', 0o755);
  const target = join(dir, 'target');
  await mkdir(target);
  const fresh = join(dir, 'a', 'postfix');
  assert.equal(await linkTo(fresh, target), true);
  assert.equal(await readlink(fresh), target);
  assert.equal(await linkTo(fresh, target), true);

  const stale = join(dir, 'stale');
  await linkTo(stale, join(dir, 'elsewhere'));
  assert.equal(await linkTo(stale, target), true);
  assert.equal(await readlink(stale), target);

  // What a start that failed on the 0700 directory left: etc/ and queue/, empty.
  const leftover = join(dir, 'leftover');
  await mkdir(join(leftover, 'etc'), { recursive: true });
  await mkdir(join(leftover, 'queue'));
  assert.equal(await linkTo(leftover, target), true);
  assert.equal((await lstat(leftover)).isSymbolicLink(), true);

  const used = join(dir, 'used');
  await mkdir(join(used, 'etc'), { recursive: true });
  await writeFile(join(used, 'etc', 'main.cf'), '# kept\n');
  assert.equal(await linkTo(used, target), false);
  assert.equal((await lstat(used)).isDirectory(), true);
});

test('a service whose RUN_DIR is under a 0700 directory prepares its Postfix outside it', async () => {
  assert.equal(findPostfix(), undefined, 'this test needs Postfix installed and root');
  const closed = await home('root-like', 0o700);
  const runDir = join(closed, 'agent-inbox', '.run');
  const config = loadConfig({ MAIL_DOMAIN: 'svc.test', RUN_DIR: runDir, SMTP_PORT: '2599' });
  const instance = PostfixInstance.forService(config, {}, join(base, 'var-lib'));
  assert.ok(instance.moved);
  await instance.prepare();
  // RUN_DIR/postfix leads to the instance; its queue belongs to postfix, who can reach it.
  assert.equal(dirname(await readlink(join(runDir, 'postfix'))), join(base, 'var-lib'));
  assert.equal(await readlink(join(runDir, 'postfix')), dirname(instance.dirs.queueDirectory));
  const incoming = await stat(join(runDir, 'postfix', 'queue', 'incoming'));
  assert.equal(incoming.uid, (await stat(instance.dirs.dataDirectory)).uid);
  assert.notEqual(incoming.uid, 0);
  assert.equal(unsearchableAbove(instance.dirs.queueDirectory), undefined);
  assert.doesNotMatch(await instance.maillog(), /fatal|warning/);
});

test('an instance made for a directory the postfix user cannot reach refuses to prepare, naming the directory to open', async () => {
  const closed = await home('closed-instance', 0o700);
  const instance = new PostfixInstance({
    baseDir: join(closed, 'postfix'),
    render: () => ({ mainCf: '', masterCf: '' }),
    smtp: { host: '127.0.0.1', port: 2598 },
  });
  await assert.rejects(instance.prepare(), (error: Error) => {
    assert.match(error.message, new RegExp(`${closed} has mode 700 \\(needs o\\+x\\)`));
    return true;
  });
});
