/**
 * instance - one private Postfix instance under a directory of its own: `etc/` (main.cf, master.cf),
 * `queue/`, `data/` and the `maillog` file. Nothing under /etc/postfix or /var/spool/postfix is
 * written; the system's Postfix, if any, is never touched (`postfix -c DIR` addresses only this one).
 *
 * prepare() writes the rendered configuration and lets `postfix -c DIR check` create the queue and
 * data directories with the owners Postfix wants. start() starts the master (optionally inside a
 * private mount namespace whose /etc/resolv.conf is a bind-mounted test file, MAIL-FACTS F.2) and
 * waits for an SMTP greeting. stop() is idempotent and ends only this instance's master, by the pid in
 * its own pid file. Every failure throws an Error that quotes Postfix's output and the maillog tail.
 * Starting needs root (the master binds ports, switches to the postfix user and owns the queue).
 */
import { execFile } from 'node:child_process';
import { existsSync, readFileSync, realpathSync } from 'node:fs';
import { chmod, mkdir, readFile, stat, utimes, writeFile } from 'node:fs/promises';
import { connect } from 'node:net';
import { dirname, join, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Config } from '../config/config.ts';
import { linkTo, postfixBase, unsearchableAbove } from './base-dir.ts';
import { type PostfixDirs, type PostfixFiles, renderPostfix } from './render.ts';

export const POSTFIX_COMMAND = '/usr/sbin/postfix';
export const POSTQUEUE_COMMAND = '/usr/sbin/postqueue';

/**
 * Why Postfix cannot be used here, as a message for the operator; undefined when it can. Pure apart
 * from the `exists` probe and the uid it is given.
 */
export function findPostfix(
  uid: number | undefined = process.getuid?.(),
  exists: (path: string) => boolean = existsSync,
): string | undefined {
  if (!exists(POSTFIX_COMMAND) || !exists(POSTQUEUE_COMMAND)) {
    return `Postfix is not installed (${POSTFIX_COMMAND} is missing): apt-get install postfix (Debian) — make run installs it when run as root`;
  }
  if (uid !== 0) {
    return 'Postfix must be started as root (its master binds the SMTP port and runs its daemons as the postfix user): run this as root';
  }
  return undefined;
}

/** The layout under one base directory. */
export function postfixDirs(baseDir: string): PostfixDirs {
  const base = resolve(baseDir);
  return {
    configDirectory: join(base, 'etc'),
    queueDirectory: join(base, 'queue'),
    dataDirectory: join(base, 'data'),
    maillogFile: join(base, 'maillog'),
  };
}

export interface QueueEntry {
  queueName: string;
  queueId: string;
  sender: string;
  recipients: { address: string; delayReason?: string }[];
}

export interface PostfixInstanceOptions {
  baseDir: string;
  /** baseDir is not `<RUN_DIR>/postfix` (base-dir.ts): prepare() makes `from` a link to it. */
  moved?: { from: string; because: string };
  /** Makes main.cf and master.cf for this instance's directories. */
  render(dirs: PostfixDirs): PostfixFiles;
  /** Where smtpd listens; start() waits for its greeting. */
  smtp: { host: string; port: number };
}

export interface StartOptions {
  /** A resolv.conf to bind-mount over /etc/resolv.conf for this instance only (tests' dnsmasq). */
  resolvConf?: string;
  /** How long to wait for the SMTP greeting; default 20 s. */
  timeoutMs?: number;
}

interface RunResult {
  code: number;
  stdout: string;
  stderr: string;
}

function run(command: string, args: string[]): Promise<RunResult> {
  return new Promise((done) => {
    execFile(command, args, { maxBuffer: 64 << 20 }, (error, stdout, stderr) => {
      const code = error ? (typeof error.code === 'number' ? error.code : 1) : 0;
      done({
        code,
        stdout: String(stdout),
        stderr: String(stderr || (error && !error.code ? error.message : '')),
      });
    });
  });
}

const shellQuote = (s: string): string => `'${s.replaceAll("'", `'\\''`)}'`;

/** Whether the process exists and is not a zombie waiting to be reaped (the master is not our child). */
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
  try {
    return !/^\d+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return true;
  }
}

/** Resolves once host:port sends a complete reply line (any code); rejects on close or timeout. */
function greeting(host: string, port: number, timeoutMs: number): Promise<string> {
  return new Promise((done, fail) => {
    const socket = connect({ host, port });
    let text = '';
    const timer = setTimeout(() => socket.destroy(new Error('no greeting')), timeoutMs);
    socket.setEncoding('latin1');
    socket.on('data', (chunk: string) => {
      text += chunk;
      const last = /^\d{3} .*\r?\n/m.exec(text);
      if (last) {
        clearTimeout(timer);
        socket.end('QUIT\r\n');
        done(text.trimEnd());
      }
    });
    socket.on('error', (error) => {
      clearTimeout(timer);
      fail(error);
    });
    socket.on('close', () => {
      clearTimeout(timer);
      fail(new Error(`connection closed before a greeting${text ? `: ${text.trim()}` : ''}`));
    });
  });
}

/**
 * Writes a config file dated two seconds ago: Postfix re-reads a table or config file whose mtime is
 * the current second until it is not (it may still be being written), which costs every Postfix
 * command run right after prepare() up to two seconds.
 */
export async function writeConfigFile(path: string, text: string): Promise<void> {
  await writeFile(path, text, { mode: 0o644 });
  const past = new Date(Date.now() - 2000);
  await utimes(path, past, past);
}

/**
 * Postfix's daemons run as the postfix user and open files under the queue and data directories, so
 * every directory above them must be searchable by others (a mkdtemp directory is 0700).
 */
async function searchableByOthers(directory: string): Promise<void> {
  const dir = unsearchableAbove(directory);
  if (dir === undefined) return;
  const mode = (await stat(dir)).mode;
  throw new Error(
    `the postfix user cannot reach ${directory}: ${dir} has mode ${(mode & 0o777).toString(8)} (needs o+x); choose another RUN_DIR or chmod o+x ${dir}`,
  );
}

export class PostfixInstance {
  readonly dirs: PostfixDirs;
  readonly smtp: { host: string; port: number };
  /** Where `<RUN_DIR>/postfix` went instead, and why (forService only). */
  readonly moved?: { from: string; because: string };
  readonly #render: (dirs: PostfixDirs) => PostfixFiles;

  /**
   * The receiving MX of this service, under `<RUN_DIR>/postfix`, or where base-dir.ts moves it when
   * the postfix user could not reach that.
   */
  static forService(
    config: Config,
    overrides: Record<string, string> = {},
    fallbackRoot?: string,
  ): PostfixInstance {
    const base = postfixBase(config.runDir, fallbackRoot);
    return new PostfixInstance({
      baseDir: base.dir,
      moved: base.moved,
      render: (dirs) => renderPostfix(config, dirs, overrides),
      smtp: {
        host: ['', '*', '0.0.0.0', '::'].includes(config.smtpHost) ? '127.0.0.1' : config.smtpHost,
        port: config.smtpPort,
      },
    });
  }

  constructor(options: PostfixInstanceOptions) {
    this.dirs = postfixDirs(options.baseDir);
    this.smtp = options.smtp;
    this.moved = options.moved;
    this.#render = options.render;
  }

  get pidFile(): string {
    return join(this.dirs.queueDirectory, 'pid', 'master.pid');
  }

  /** Writes main.cf and master.cf and lets Postfix create its queue and data directories. */
  async prepare(): Promise<void> {
    const problem = findPostfix();
    if (problem) throw new Error(problem);
    const files = this.#render(this.dirs);
    await mkdir(this.dirs.configDirectory, { recursive: true, mode: 0o755 });
    await mkdir(this.dirs.queueDirectory, { recursive: true, mode: 0o755 });
    await chmod(dirname(this.dirs.queueDirectory), 0o755);
    await searchableByOthers(dirname(this.dirs.queueDirectory));
    if (this.moved) await linkTo(this.moved.from, dirname(this.dirs.queueDirectory));
    await writeConfigFile(join(this.dirs.configDirectory, 'main.cf'), files.mainCf);
    await writeConfigFile(join(this.dirs.configDirectory, 'master.cf'), files.masterCf);
    await this.#postfix(['check']);
  }

  /** Starts the master and waits until smtpd greets. Throws if this instance already runs. */
  async start(options: StartOptions = {}): Promise<void> {
    const problem = findPostfix();
    if (problem) throw new Error(problem);
    if (this.masterPid() !== undefined)
      throw new Error(`Postfix in ${this.dirs.configDirectory} is already running`);
    if (options.resolvConf) {
      const script = `mount --bind ${shellQuote(resolve(options.resolvConf))} /etc/resolv.conf && exec ${POSTFIX_COMMAND} -c ${shellQuote(this.dirs.configDirectory)} start`;
      await this.#check(
        'start',
        await run('unshare', ['-m', '--propagation', 'private', 'sh', '-c', script]),
      );
    } else {
      await this.#postfix(['start']);
    }
    const deadline = Date.now() + (options.timeoutMs ?? 20_000);
    let lastError: unknown;
    while (Date.now() < deadline) {
      try {
        await greeting(this.smtp.host, this.smtp.port, Math.max(1000, deadline - Date.now()));
        return;
      } catch (error) {
        lastError = error;
        await sleep(100);
      }
    }
    throw new Error(
      `Postfix started but ${this.smtp.host}:${this.smtp.port} sent no greeting (${String(lastError)})\n${await this.maillogTail()}`,
    );
  }

  /**
   * Stops the master and waits until it has exited; kills it if it lingers. Sends SIGTERM to the pid
   * in this instance's pid file, which is what `postfix stop` does, without its one-second polls.
   */
  async stop(timeoutMs = 10_000): Promise<void> {
    const pid = this.masterPid();
    if (pid === undefined) return;
    process.kill(pid, 'SIGTERM');
    if (await this.#exited(pid, timeoutMs)) return;
    process.kill(pid, 'SIGKILL');
    await this.#exited(pid, 2000);
  }

  /** Asks the queue manager to retry deferred mail now (`postqueue -f`). */
  async flush(): Promise<void> {
    await this.#check('flush', await run(POSTQUEUE_COMMAND, ['-c', this.dirs.configDirectory, '-f']));
  }

  /** Every message in the queue (`postqueue -j`; works while stopped, as root). */
  async queue(): Promise<QueueEntry[]> {
    const result = await run(POSTQUEUE_COMMAND, ['-c', this.dirs.configDirectory, '-j']);
    await this.#check('queue listing', result);
    return result.stdout
      .split('\n')
      .filter((line) => line.trim() !== '')
      .map((line) => {
        const raw = JSON.parse(line) as {
          queue_name: string;
          queue_id: string;
          sender: string;
          recipients: { address: string; delay_reason?: string }[];
        };
        return {
          queueName: raw.queue_name,
          queueId: raw.queue_id,
          sender: raw.sender,
          recipients: raw.recipients.map((r) => ({ address: r.address, delayReason: r.delay_reason })),
        };
      });
  }

  async queueIds(): Promise<string[]> {
    return (await this.queue()).map((entry) => entry.queueId);
  }

  async queueEmpty(): Promise<boolean> {
    return (await this.queue()).length === 0;
  }

  /** The whole maillog ('' before the first line is written). */
  async maillog(): Promise<string> {
    try {
      return await readFile(this.dirs.maillogFile, 'utf8');
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === 'ENOENT') return '';
      throw error;
    }
  }

  /** The master's pid while it runs, from this instance's own pid file. */
  masterPid(): number | undefined {
    let text: string;
    try {
      text = readFileSync(this.pidFile, 'utf8');
    } catch {
      return undefined;
    }
    const pid = Number(text.trim());
    if (!Number.isSafeInteger(pid) || pid <= 0 || !alive(pid)) return undefined;
    // A stale pid file may name a process that has nothing to do with us: the master works in its
    // queue directory.
    try {
      if (realpathSync(`/proc/${pid}/cwd`) !== realpathSync(this.dirs.queueDirectory)) return undefined;
    } catch {
      return undefined;
    }
    return pid;
  }

  async maillogTail(lines = 20): Promise<string> {
    return (await this.maillog()).trimEnd().split('\n').slice(-lines).join('\n');
  }

  async #exited(pid: number, timeoutMs: number): Promise<boolean> {
    const deadline = Date.now() + timeoutMs;
    while (alive(pid)) {
      if (Date.now() > deadline) return false;
      await sleep(50);
    }
    return true;
  }

  async #postfix(args: string[]): Promise<void> {
    await this.#check(args.join(' '), await run(POSTFIX_COMMAND, ['-c', this.dirs.configDirectory, ...args]));
  }

  async #check(what: string, result: RunResult): Promise<void> {
    if (result.code === 0) return;
    const output = `${result.stdout}${result.stderr}`.trim();
    throw new Error(
      `postfix ${what} failed (exit ${result.code}) for ${this.dirs.configDirectory}: ${output}\n${await this.maillogTail()}`,
    );
  }
}
