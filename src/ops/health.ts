/**
 * health - liveness and readiness of one process, for `GET /livez` and `GET /readyz` (on the API port
 * for the API, on the metrics port for every daemon).
 *
 * Live: the process answers at all (its event loop turns). Nothing else is checked: restarting a
 * process because its database is down would not bring the database back.
 * Ready: the database answers `SELECT 1` within CHECK_TIMEOUT_MS, every watched part is `ok` (under
 * `all`, our Postfix's master still runs), and the process is not stopping.
 * From SIGTERM on, readiness answers 503 while the daemons finish what they have in flight, so a
 * load balancer stops sending new work. A readiness failure is logged once when it starts and once
 * when it ends, with the error (the probe's answer names only the check).
 */
import type { Log } from '../log.ts';

/** Well under the usual probe timeouts (Kubernetes: 1 s default, compose health checks: 30 s). */
export const CHECK_TIMEOUT_MS = 900;

export interface Readiness {
  ok: boolean;
  /** `ok`, or what is wrong, per check (no error text: the probe is not the place for details). */
  checks: Record<string, string>;
}

export class Health {
  readonly #ping: () => Promise<unknown>;
  readonly #log: Log;
  #stopping = false;
  #failing = false;
  /** One ping at a time: probes arriving while the database hangs share it instead of piling up. */
  #pinging: Promise<unknown> | undefined;
  /** Other parts of the process, by name: each says `ok` or what is wrong, at once. */
  readonly #watched = new Map<string, { check: () => string; last: string }>();

  constructor(ping: () => Promise<unknown>, log: Log) {
    this.#ping = ping;
    this.#log = log;
  }

  /** Not ready from now on (the process was told to stop). */
  stop(): void {
    this.#stopping = true;
  }

  get stopping(): boolean {
    return this.#stopping;
  }

  /** Readiness also needs `check()` to say `ok`; a change of its answer is logged once. */
  watch(name: string, check: () => string): void {
    this.#watched.set(name, { check, last: 'ok' });
  }

  #watchedChecks(): Record<string, string> {
    const checks: Record<string, string> = {};
    for (const [name, watched] of this.#watched) {
      let answer: string;
      try {
        answer = watched.check();
      } catch (error) {
        answer = `check failed: ${error instanceof Error ? error.message : String(error)}`;
      }
      if (answer !== watched.last) {
        this.#log(
          answer === 'ok'
            ? { msg: `ready again: ${name} ok` }
            : { level: 'error', msg: `not ready: ${name} ${answer}` },
        );
        watched.last = answer;
      }
      checks[name] = answer;
    }
    return checks;
  }

  async ready(): Promise<Readiness> {
    if (this.#stopping) return { ok: false, checks: { process: 'stopping' } };
    const database = await this.#database();
    const checks = { ...database, ...this.#watchedChecks() };
    return { ok: Object.values(checks).every((c) => c === 'ok'), checks };
  }

  async #database(): Promise<Record<string, string>> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new Error(`no answer within ${CHECK_TIMEOUT_MS} ms`)),
        CHECK_TIMEOUT_MS,
      );
    });
    try {
      this.#pinging ??= this.#ping().finally(() => {
        this.#pinging = undefined;
      });
      await Promise.race([this.#pinging, timeout]);
      if (this.#failing) this.#log({ msg: 'ready again: the database answers' });
      this.#failing = false;
      return { database: 'ok' };
    } catch (error) {
      if (!this.#failing) {
        this.#log({
          level: 'warn',
          msg: 'not ready: the database does not answer',
          error: error instanceof Error ? error.message : String(error),
        });
      }
      this.#failing = true;
      return { database: 'unreachable' };
    } finally {
      clearTimeout(timer);
    }
  }
}
