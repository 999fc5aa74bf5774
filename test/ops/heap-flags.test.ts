/**
 * The entries that move message bytes run with their V8 heap flags (src/heap-flags.ts): the process
 * started as `node src/main.ts lmtp` re-executes itself under the same pid with the flags, once; other
 * entries keep V8's defaults; a flag the operator gives is kept as given.
 */
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { after, afterEach, before, test } from 'node:test';
import { HEAP_FLAGS, missingHeapFlags } from '../../src/heap-flags.ts';
import { freshDatabase, type TestDatabase } from '../support/database.ts';
import { type DaemonProcess, daemonEnv, startDaemon } from './daemon-process.ts';

let database: TestDatabase;
const daemons: DaemonProcess[] = [];

before(async () => {
  database = await freshDatabase();
});
afterEach(() => {
  for (const daemon of daemons.splice(0)) daemon.kill();
});
after(async () => {
  await database.drop();
});

/** The running process's command line, as the kernel has it after any exec. */
async function commandLine(pid: number): Promise<string[]> {
  return (await readFile(`/proc/${pid}/cmdline`, 'utf8')).split('\0').filter(Boolean);
}

async function started(entry: string, env: Record<string, string> = {}): Promise<DaemonProcess> {
  const daemon = await startDaemon(entry, daemonEnv(database.url, env));
  daemons.push(daemon);
  return daemon;
}

test('missingHeapFlags: every flag of the entry unless already given, in any spelling or sense', () => {
  assert.deepEqual(missingHeapFlags('lmtp', []), HEAP_FLAGS.lmtp);
  assert.deepEqual(missingHeapFlags('milter', ['--max-semi-space-size=2']), ['--initial-old-space-size=128']);
  assert.deepEqual(
    missingHeapFlags('lmtp', ['--initial_old_space_size=64'], ' --max-semi-space-size=16 '),
    [],
  );
  assert.deepEqual(missingHeapFlags('all', ['--no-max-semi-space-size', '--trace-gc']), [
    '--initial-old-space-size=128',
  ]);
  assert.deepEqual(missingHeapFlags('policy', []), []);
  assert.deepEqual(missingHeapFlags('toString', []), [], 'not an entry, whatever the prototype has');
  assert.deepEqual(missingHeapFlags('api', []), []);
});

test('the LMTP receiver runs with the heap flags under the pid it was started as; the policy daemon without', async () => {
  const lmtp = await started('lmtp');
  const pid = lmtp.child.pid as number;
  const lmtpArgs = await commandLine(pid);
  for (const flag of HEAP_FLAGS.lmtp ?? []) assert.ok(lmtpArgs.includes(flag), lmtpArgs.join(' '));
  assert.equal(lmtpArgs.filter((arg) => arg.endsWith('src/main.ts')).length, 1);
  assert.equal(lmtpArgs.at(-1), 'lmtp');

  const policy = await started('policy');
  const policyArgs = await commandLine(policy.child.pid as number);
  assert.deepEqual(policyArgs.slice(1), ['src/main.ts', 'policy']);
});

test("HEAP_FLAGS=off: the receiver runs with V8's defaults", async () => {
  const lmtp = await started('lmtp', { HEAP_FLAGS: 'off' });
  const args = await commandLine(lmtp.child.pid as number);
  assert.deepEqual(args.slice(1), ['src/main.ts', 'lmtp']);
});

test('a flag given in NODE_OPTIONS is kept, and the others are still added', async () => {
  const milter = await started('milter', { NODE_OPTIONS: '--max-semi-space-size=2' });
  const args = await commandLine(milter.child.pid as number);
  assert.ok(args.includes('--initial-old-space-size=128'), args.join(' '));
  assert.ok(!args.some((arg) => arg.startsWith('--max-semi-space-size')), args.join(' '));
});
