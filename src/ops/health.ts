/**
 * health - liveness and readiness of one process, for `GET /livez` and `GET /readyz` (on the API port
 * for the API, on the metrics port for every daemon).
 *
 * Live: the process answers at all (its event loop turns). Nothing else is checked: restarting a
 * process because its database is down would not bring the database back.
 * Ready: the database answers `SELECT 1` within CHECK_TIMEOUT_MS, and the process is not stopping.
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

  async ready(): Promise<Readiness> {
    if (this.#stopping) return { ok: false, checks: { process: 'stopping' } };
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
      return { ok: true, checks: { database: 'ok' } };
    } catch (error) {
      if (!this.#failing) {
        this.#log({
          level: 'warn',
          msg: 'not ready: the database does not answer',
          error: error instanceof Error ? error.message : String(error),
        });
      }
      this.#failing = true;
      return { ok: false, checks: { database: 'unreachable' } };
    } finally {
      clearTimeout(timer);
    }
  }
}
