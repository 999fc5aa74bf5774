/**
 * secret-key - in dev, when SECRET_KEY is unset, the service makes one and keeps it in
 * `$RUN_DIR/secret-key` (mode 0600) so every process and every restart share it. In prod the
 * variable is required (config.ts refuses to start without it).
 */
import { randomBytes } from 'node:crypto';
import { link, mkdir, readFile, unlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { Config } from './config.ts';

export async function ensureSecretKey(config: Config): Promise<Config & { secretKey: string }> {
  if (config.secretKey !== undefined) return { ...config, secretKey: config.secretKey };
  const path = join(config.runDir, 'secret-key');
  await mkdir(config.runDir, { recursive: true });
  const made = randomBytes(32).toString('base64url');
  // Written whole to a private file, then linked into place: a concurrent reader never sees it half
  // written, and of two processes starting together the first link wins and both use its key.
  const draft = `${path}.${process.pid}.${randomBytes(4).toString('hex')}`;
  await writeFile(draft, `${made}\n`, { mode: 0o600, flag: 'wx' });
  try {
    await link(draft, path);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
  } finally {
    await unlink(draft);
  }
  const secretKey = (await readFile(path, 'utf8')).trim();
  if (secretKey.length < 32)
    throw new Error(`${path} holds a key shorter than 32 characters; remove it or set SECRET_KEY`);
  return { ...config, secretKey };
}
