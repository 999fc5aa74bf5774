/**
 * daemons - our mail daemons and the API as child processes (`node src/main.ts policy|milter|lmtp|api`,
 * the production shape), which the crash soak kills, freezes and starts again.
 *
 * A start appends to the daemon's log file and resolves once the daemon accepts connections; a kill
 * is SIGKILL (no clean-up of any kind runs: what the OOM killer or a `docker kill` does), a freeze is
 * SIGSTOP until SIGCONT.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { open } from 'node:fs/promises';
import { join } from 'node:path';
import { waitListening } from '../bench/wait-listening.ts';

export type DaemonName = 'policy' | 'milter' | 'lmtp' | 'api';

export class Daemon {
  readonly name: DaemonName;
  readonly #port: number;
  readonly #env: Record<string, string>;
  readonly #logFile: string;
  #child: ChildProcess | undefined;
  #stopping = false;
  starts = 0;
  /** Exits nobody asked for (a crash of its own: a bug), as `code` or `signal`. */
  readonly crashes: string[] = [];

  constructor(name: DaemonName, port: number, env: Record<string, string>, logDir: string) {
    this.name = name;
    this.#port = port;
    this.#env = env;
    this.#logFile = join(logDir, `${name}.log`);
  }

  get logFile(): string {
    return this.#logFile;
  }

  get running(): boolean {
    return this.#child !== undefined && this.#child.exitCode === null && this.#child.signalCode === null;
  }

  async start(): Promise<void> {
    if (this.running) return;
    const log = await open(this.#logFile, 'a');
    const child = spawn(process.execPath, ['src/main.ts', this.name], {
      env: { ...process.env, ...this.#env },
      stdio: ['ignore', log.fd, log.fd],
    });
    await log.close();
    this.#stopping = false;
    child.once('exit', (code, signal) => {
      if (!this.#stopping) this.crashes.push(String(code ?? signal));
    });
    this.#child = child;
    this.starts++;
    await waitListening(this.name, this.#port, child);
  }

  /** SIGKILL, and waits until the process is gone. */
  async kill(): Promise<void> {
    await this.#end((child) => child.kill('SIGKILL'));
  }

  /** SIGSTOP for `ms`, then SIGCONT. */
  async freeze(ms: number): Promise<void> {
    const child = this.#child;
    if (!child || !this.running) return;
    child.kill('SIGSTOP');
    await new Promise((done) => setTimeout(done, ms));
    child.kill('SIGCONT');
  }

  /** SIGTERM (a clean stop, of a frozen process too), then SIGKILL after 15 s. */
  async stop(): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    await this.#end((child) => {
      child.kill('SIGCONT');
      child.kill('SIGTERM');
      timer = setTimeout(() => child.kill('SIGKILL'), 15_000);
    });
    clearTimeout(timer);
  }

  /** Ends the running process with `signal` (an exit asked for: not a crash) and waits for its exit. */
  async #end(signal: (child: ChildProcess) => void): Promise<void> {
    const child = this.#child;
    if (!child || !this.running) return;
    const exited = new Promise((done) => child.once('exit', done));
    this.#stopping = true;
    signal(child);
    await exited;
  }
}
