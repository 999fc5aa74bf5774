/**
 * run-lock - one `all` process (`make run`) per RUN_DIR.
 *
 * `all` stops a Postfix master its RUN_DIR's pid file names, to clear one a killed run left behind.
 * A second `make run` in the same checkout (other ports, same RUN_DIR) therefore took the first one's
 * Postfix down, which then kept answering /readyz while no SMTP listened, and each one's Ctrl-C stopped
 * the other's Postfix. The lock is a file holding the owner's pid, made whole under another name and
 * then linked into place (link fails if it exists: no one ever reads a lock half written); one naming
 * a process that is gone, or is no `main.ts all`, is stale and replaced. Two processes replacing the
 * same stale lock at the same instant may both win; that needs two starts racing just after a crash.
 */
import { readFileSync } from 'node:fs';
import { link, mkdir, readFile, unlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';

export class RunDirBusy extends Error {}

export interface RunLock {
  readonly path: string;
  release(): Promise<void>;
}

/** Whether `pid` is a live `main.ts all` process (when /proc cannot tell, any live process). */
function liveMain(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
  let args: string[];
  try {
    args = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
  } catch {
    return true;
  }
  // `all` is also the entry when none is named (cmdline ends with a NUL: a last '' element).
  return args.some((arg, i) => arg.endsWith('main.ts') && (args[i + 1] === 'all' || !args[i + 1]));
}

/** Takes RUN_DIR's lock for this process; throws RunDirBusy naming the live owner. */
export async function lockRunDir(runDir: string): Promise<RunLock> {
  await mkdir(runDir, { recursive: true });
  const path = join(runDir, 'all.pid');
  const mine = `${path}.${process.pid}`;
  await writeFile(mine, `${process.pid}\n`);
  try {
    for (let attempt = 0; ; attempt++) {
      try {
        await link(mine, path);
        break;
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== 'EEXIST' || attempt >= 2) throw error;
      }
      const owner = Number((await readFile(path, 'utf8').catch(() => '')).trim());
      if (owner === process.pid) break;
      if (Number.isSafeInteger(owner) && owner > 0 && liveMain(owner)) {
        throw new RunDirBusy(
          `RUN_DIR ${runDir} is in use by another "all" process (pid ${owner}, make run): stop it, ` +
            'or give this one its own RUN_DIR',
        );
      }
      await unlink(path).catch(() => {});
    }
  } finally {
    await unlink(mine).catch(() => {});
  }
  return {
    path,
    async release() {
      const owner = (await readFile(path, 'utf8').catch(() => '')).trim();
      if (owner === String(process.pid)) await unlink(path).catch(() => {});
    },
  };
}
