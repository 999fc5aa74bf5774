/**
 * inbox-changes - one PostgreSQL connection that LISTENs on `inbox_changes`
 * (migrations/20261129000000_inbox_change_notify.ts) and passes each announcement to its subscriber,
 * with whether it is listening at all.
 *
 * Listening counts only once proven: after LISTEN, a probe announced from another connection (the
 * pool's) must come back. Behind a proxy that pools by transaction (PgBouncer's default), LISTEN is
 * accepted but announcements do not reliably reach this connection; the probe then times out and the
 * subscriber is never told it is listening, so it keeps nothing.
 *
 * A lost connection is reported at once (`listening(false)`: announcements made while it is down are
 * lost, so the subscriber drops what it kept) and retried every `retryMs` until `close()`.
 *
 * A connection can also die without a word: a database host gone without a reset, or a firewall or NAT
 * that drops an idle connection, and this one is idle between announcements. Nothing would then tell
 * the subscriber, and it would keep what it read for good. So the probe is repeated every `recheckMs`
 * while listening; one that does not come back counts as a lost connection. TCP keepalive on the
 * connection keeps such middleboxes from forgetting it in the first place.
 */
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import type { Log } from '../log.ts';
import type { Database } from './database.ts';

export const CHANNEL = 'inbox_changes';
const PROBE = 'probe:';

export interface ChangeSubscriber {
  /** An inbox id whose settings changed or whose row is gone, or `*`: anything may have changed. */
  changed(what: string): void;
  listening(up: boolean): void;
}

export interface FeedOptions {
  retryMs?: number;
  probeTimeoutMs?: number;
  /** How often a listening connection is proven again (default 30 s). */
  recheckMs?: number;
}

export class InboxChangeFeed {
  readonly #url: string;
  readonly #db: Database;
  readonly #subscriber: ChangeSubscriber;
  readonly #log: Log;
  readonly #retryMs: number;
  readonly #probeTimeoutMs: number;
  readonly #recheckMs: number;
  #client: pg.Client | undefined;
  #retry: NodeJS.Timeout | undefined;
  #recheck: NodeJS.Timeout | undefined;
  /** Probes announced and not yet back, by payload. */
  readonly #probes = new Map<string, () => void>();
  #up = false;
  #failing = false;
  #closed = false;

  constructor(url: string, db: Database, subscriber: ChangeSubscriber, log: Log, options: FeedOptions = {}) {
    this.#url = url;
    this.#db = db;
    this.#subscriber = subscriber;
    this.#log = log;
    this.#retryMs = options.retryMs ?? 1000;
    this.#probeTimeoutMs = options.probeTimeoutMs ?? 5000;
    this.#recheckMs = options.recheckMs ?? 30_000;
  }

  get listening(): boolean {
    return this.#up;
  }

  /** Resolves once listening, or once the first attempt failed (it is retried in the background). */
  start(): Promise<void> {
    return this.#connect();
  }

  async close(): Promise<void> {
    this.#closed = true;
    clearTimeout(this.#retry);
    clearTimeout(this.#recheck);
    const client = this.#client;
    this.#client = undefined;
    this.#down();
    await client?.end().catch(() => {});
  }

  async #connect(): Promise<void> {
    if (this.#closed) return;
    const client = new pg.Client({
      connectionString: this.#url,
      keepAlive: true,
      keepAliveInitialDelayMillis: 30_000,
    });
    this.#client = client;
    client.on('notification', ({ channel, payload }) => {
      if (client !== this.#client || channel !== CHANNEL) return;
      if (payload?.startsWith(PROBE)) {
        this.#probes.get(payload)?.();
        return;
      }
      this.#subscriber.changed(payload || '*');
    });
    client.on('error', (error) => this.#lost(client, error));
    client.on('end', () => this.#lost(client, new Error('connection ended')));
    try {
      await client.connect();
      await client.query(`LISTEN ${CHANNEL}`);
      await this.#roundTrip();
    } catch (error) {
      this.#lost(client, error instanceof Error ? error : new Error(String(error)));
      return;
    }
    if (client !== this.#client) return;
    this.#up = true;
    if (this.#failing) this.#log({ level: 'info', msg: 'inbox change feed listening again' });
    this.#failing = false;
    this.#subscriber.listening(true);
    this.#scheduleRecheck(client);
  }

  /** Proves the listening connection again in `recheckMs`, and so on while it is the current one. */
  #scheduleRecheck(client: pg.Client): void {
    this.#recheck = setTimeout(async () => {
      if (client !== this.#client || this.#closed) return;
      try {
        await this.#roundTrip();
      } catch (error) {
        this.#lost(client, error instanceof Error ? error : new Error(String(error)));
        return;
      }
      this.#scheduleRecheck(client);
    }, this.#recheckMs);
    this.#recheck.unref();
  }

  /**
   * Resolves once every announcement committed before the call has been passed to the subscriber: a
   * probe announced now arrives after them (a session gets its notifications in commit order). At once
   * when not listening (nothing is kept then). Rejects if the probe does not come back in time. For
   * tests that change an inbox and then expect the change at the very next RCPT.
   */
  async sync(): Promise<void> {
    if (this.#up) await this.#roundTrip();
  }

  /** Announces a probe from a pooled connection and waits for it to arrive on the listening one. */
  async #roundTrip(): Promise<void> {
    const payload = `${PROBE}${randomUUID()}`;
    const arrived = new Promise<void>((resolve) => this.#probes.set(payload, resolve));
    let timer: NodeJS.Timeout | undefined;
    try {
      await this.#db.rows('inbox-changes-probe', 'SELECT pg_notify($1, $2)', [CHANNEL, payload]);
      // Timed from the announcement on: a pool slow to announce it is a busy database, not a lost
      // listener, and dropping what is kept would only add to its load.
      await Promise.race([
        arrived,
        new Promise<never>((_, reject) => {
          timer = setTimeout(
            () => reject(new Error(`no announcement came back within ${this.#probeTimeoutMs} ms`)),
            this.#probeTimeoutMs,
          );
        }),
      ]);
    } finally {
      clearTimeout(timer);
      this.#probes.delete(payload);
    }
  }

  #lost(client: pg.Client, error: Error): void {
    if (client !== this.#client) return;
    this.#client = undefined;
    client.end().catch(() => {});
    this.#down();
    if (this.#closed) return;
    if (!this.#failing) {
      this.#log({
        level: 'warn',
        msg: 'inbox change feed not listening; every RCPT reads PostgreSQL until it is',
        error: error.message,
      });
    }
    this.#failing = true;
    this.#retry = setTimeout(() => void this.#connect(), this.#retryMs);
    this.#retry.unref();
  }

  #down(): void {
    if (!this.#up) return;
    this.#up = false;
    this.#subscriber.listening(false);
  }
}
