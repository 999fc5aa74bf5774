/**
 * base-dir - where the service's own Postfix (`make run`, `node src/main.ts all`) keeps its
 * configuration, queue and maillog: `<RUN_DIR>/postfix`, unless a directory above it is not searchable
 * by others. Postfix's daemons run as the postfix user and must reach the queue, so a checkout under
 * root's home (`/root` is 0700 on Debian) could not run its Postfix there. Then the instance lives
 * under FALLBACK_ROOT in a directory named after RUN_DIR's absolute path (the same one on every start,
 * so a queue left by the last run is found again), and `<RUN_DIR>/postfix` is made a symbolic link to it
 * (postfix/README.md's commands keep working for root).
 */
import { createHash } from 'node:crypto';
import { lstatSync, readdirSync, type Stats, statSync } from 'node:fs';
import { lstat, mkdir, readlink, rm, symlink } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';

export const FALLBACK_ROOT = '/var/lib/agent-inbox';

export interface PostfixBase {
  /** The directory the instance lives in. */
  dir: string;
  /** When it is not `<RUN_DIR>/postfix`: that path (to be a link to `dir`) and why. */
  moved?: { from: string; because: string };
}

/** The first existing directory at or above `path` that others cannot search, if any. */
export function unsearchableAbove(path: string): string | undefined {
  for (let dir = resolve(path); ; dir = dirname(dir)) {
    let mode: number | undefined;
    try {
      mode = statSync(dir).mode;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'ENOENT') throw error;
    }
    // A directory that does not exist yet is made 0755.
    if (mode !== undefined && (mode & 0o001) === 0) return dir;
    if (dir === dirname(dir)) return undefined;
  }
}

export function postfixBase(runDir: string, fallbackRoot = FALLBACK_ROOT): PostfixBase {
  const wanted = resolve(runDir, 'postfix');
  const blocked = unsearchableAbove(dirname(wanted));
  if (blocked === undefined) return { dir: wanted };
  const name = createHash('sha256').update(wanted).digest('hex').slice(0, 12);
  return {
    dir: join(fallbackRoot, `postfix-${name}`),
    moved: { from: wanted, because: `${blocked} is not searchable by the postfix user (no o+x)` },
  };
}

/**
 * Makes `from` a symbolic link to `to`: made when missing, pointed anew when it links elsewhere, and an
 * empty directory (what a start that failed for want of this left) replaced. Anything else is left as
 * it is; the return says whether `from` now leads to `to`.
 */
export async function linkTo(from: string, to: string): Promise<boolean> {
  await mkdir(dirname(from), { recursive: true });
  let found: Stats | undefined;
  try {
    found = await lstat(from);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'ENOENT') throw error;
  }
  if (found?.isSymbolicLink()) {
    if ((await readlink(from)) === to) return true;
    await rm(from);
  } else if (found?.isDirectory()) {
    if (!isEmptyTree(from)) return false;
    await rm(from, { recursive: true });
  } else if (found) {
    return false;
  }
  await symlink(to, from);
  return true;
}

/** A directory holding nothing but (empty) directories. */
function isEmptyTree(dir: string): boolean {
  for (const entry of readdirSync(dir)) {
    const path = join(dir, entry);
    if (!lstatSync(path).isDirectory() || !isEmptyTree(path)) return false;
  }
  return true;
}
