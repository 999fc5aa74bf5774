/**
 * wait-listening - waits until a benchmark's server process accepts connections, instead of a fixed
 * sleep: fails at once, naming the process, when it exits first, and after `timeoutMs` otherwise.
 */
import type { ChildProcess } from 'node:child_process';
import net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';

/** A TCP port on 127.0.0.1, or a unix socket path. */
export type ListenTarget = number | string;

const accepts = (target: ListenTarget) =>
  new Promise<boolean>((resolve) => {
    const socket =
      typeof target === 'number' ? net.connect(target, '127.0.0.1') : net.connect({ path: target });
    socket.once('connect', () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('error', () => resolve(false));
  });

export async function waitListening(
  name: string,
  target: ListenTarget,
  child: ChildProcess,
  timeoutMs = 30_000,
): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (performance.now() < deadline) {
    if (child.exitCode !== null || child.signalCode !== null) {
      throw new Error(`${name} exited (${child.exitCode ?? child.signalCode}) before listening on ${target}`);
    }
    if (await accepts(target)) return;
    await sleep(100);
  }
  throw new Error(`${name} did not listen on ${target} within ${timeoutMs} ms`);
}
