/**
 * secret-key - in dev, when SECRET_KEY is unset, the service makes one and keeps it in
 * `$RUN_DIR/secret-key` (mode 0600) so every process and every restart share it. In prod the
 * variable is required (config.ts refuses to start without it).
 */
import { randomBytes } from 'node:crypto';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { Config } from './config.ts';

export async function ensureSecretKey(config: Config): Promise<Config & { secretKey: string }> {
  if (config.secretKey !== undefined) return { ...config, secretKey: config.secretKey };
  const path = join(config.runDir, 'secret-key');
  await mkdir(config.runDir, { recursive: true });
  const made = randomBytes(32).toString('base64url');
  try {
    await writeFile(path, `${made}\n`, { mode: 0o600, flag: 'wx' });
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
  }
  const secretKey = (await readFile(path, 'utf8')).trim();
  if (secretKey.length < 32)
    throw new Error(`${path} holds a key shorter than 32 characters; remove it or set SECRET_KEY`);
  return { ...config, secretKey };
}
