/**
 * start-script - runs one of the images' start scripts (docker/start/) natively, the way a container
 * runs it: its own environment only, Node 24 first on the PATH (`node` is /usr/local/bin/node there).
 */
import { execFile } from 'node:child_process';
import { dirname, join } from 'node:path';
import { REPO } from './compose-file.ts';

export const START = join(REPO, 'docker', 'start');
export const PATH = `${dirname(process.execPath)}:${process.env.PATH ?? '/usr/bin:/bin'}`;

export interface Result {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs a start script with exactly this environment (plus PATH), like a container would. */
export function script(
  name: string,
  args: string[],
  env: Record<string, string>,
  timeoutMs = 30_000,
): Promise<Result> {
  return new Promise((resolve) => {
    execFile(
      join(START, name),
      args,
      { env: { PATH, ...env }, timeout: timeoutMs },
      (error, stdout, stderr) => {
        const code = error ? (typeof error.code === 'number' ? error.code : null) : 0;
        resolve({ code, stdout: String(stdout), stderr: String(stderr) });
      },
    );
  });
}
