/**
 * run-lock (src/ops/run-lock.ts): one `main.ts all` per RUN_DIR. Processes started at the same instant
 * get one lock between them; a lock naming a dead process, or a live one that is no `main.ts all`, is
 * replaced; release removes only one's own.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { lockRunDir } from '../../src/ops/run-lock.ts';

const RUN_LOCK = fileURLToPath(new URL('../../src/ops/run-lock.ts', import.meta.url));
let base: string;
before(async () => {
  base = await mkdtemp(join(tmpdir(), 'run-lock-'));
});
after(() => rm(base, { recursive: true, force: true }));

/**
 * Runs `main.ts all` stand-ins that each try the lock at `start`; the one that gets it holds it until
 * every one has said how it fared (a fixed hold let a racer that started late on a busy machine find
 * the lock released and take it too).
 */
async function race(dir: string, count: number): Promise<string[]> {
  const script = join(base, 'main.ts');
  await writeFile(
    script,
    `import { lockRunDir } from ${JSON.stringify(RUN_LOCK)};
     const start = Number(process.argv[3]);
     await new Promise((resolve) => setTimeout(resolve, start - Date.now()));
     try {
       const lock = await lockRunDir(process.argv[4]);
       process.stdout.write('GOT');
       process.stdin.resume();
       await new Promise((resolve) => process.stdin.once('end', resolve));
       await lock.release();
     } catch (error) {
       process.stdout.write(error.constructor.name);
     }`,
  );
  const start = String(Date.now() + 800);
  const children = Array.from({ length: count }, () =>
    spawn(process.execPath, [script, 'all', start, dir], { stdio: ['pipe', 'pipe', 'inherit'] }),
  );
  const outcomes = await Promise.all(
    children.map(async (child) => {
      const [said] = (await once(child.stdout, 'data')) as [Buffer];
      return said.toString();
    }),
  );
  for (const child of children) child.stdin.end();
  await Promise.all(children.map((child) => (child.exitCode === null ? once(child, 'exit') : undefined)));
  return outcomes;
}

test('of processes taking the lock at the same instant, one gets it and the others are told who has it', async () => {
  for (let round = 0; round < 5; round++) {
    const outcomes = await race(join(base, `race-${round}`), 4);
    assert.deepEqual(outcomes.sort(), ['GOT', 'RunDirBusy', 'RunDirBusy', 'RunDirBusy'], `round ${round}`);
  }
});

test('a lock naming a dead process or one that is no main.ts all is replaced; release removes only ours', async () => {
  const dir = join(base, 'stale');
  await mkdir(dir);
  const dead = spawn(process.execPath, ['-e', '']);
  await new Promise((resolve) => dead.once('exit', resolve));
  // pid 1 and the test runner live, but are no `main.ts all`.
  for (const stale of [dead.pid, 1, process.ppid]) {
    await writeFile(join(dir, 'all.pid'), `${stale}\n`);
    const lock = await lockRunDir(dir);
    assert.equal((await readFile(lock.path, 'utf8')).trim(), String(process.pid));
    await writeFile(lock.path, '12345678\n'); // someone else's now
    await lock.release();
    assert.equal((await readFile(lock.path, 'utf8')).trim(), '12345678');
  }
});
