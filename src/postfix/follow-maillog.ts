/**
 * follow-maillog - copies the lines Postfix appends to its maillog file onto our log, so `make run`
 * shows Postfix's decisions in the foreground beside the daemons' own lines.
 */
import { open } from 'node:fs/promises';
import type { Log } from '../log.ts';

const POLL_MS = 250;

/** Follows from the file's current end (or its start, if it does not exist yet). */
export function followMaillog(path: string, log: Log): { stop(): void } {
  let position = -1;
  let partial = '';
  let busy = false;
  const poll = async () => {
    if (busy) return;
    busy = true;
    try {
      const file = await open(path, 'r').catch(() => undefined);
      if (!file) {
        position = 0; // created later: every line is new
        return;
      }
      try {
        const { size } = await file.stat();
        if (position < 0 || size < position) position = position < 0 ? size : 0;
        while (position < size) {
          const buffer = Buffer.alloc(Math.min(64 * 1024, size - position));
          const { bytesRead } = await file.read(buffer, 0, buffer.length, position);
          if (bytesRead === 0) break;
          position += bytesRead;
          const lines = (partial + buffer.subarray(0, bytesRead).toString('utf8')).split('\n');
          partial = lines.pop() ?? '';
          for (const line of lines) if (line) log({ msg: line });
        }
      } finally {
        await file.close();
      }
    } finally {
      busy = false;
    }
  };
  void poll();
  const timer = setInterval(() => void poll(), POLL_MS);
  return { stop: () => clearInterval(timer) };
}
