/**
 * reservation-ledger - which of this milter process's end-of-data decisions are between their start
 * and the answer reaching Postfix (or their reservations' withdrawal), so that its heartbeat can say
 * exactly which of its reservations may never have been answered (mail/orphan-sweep.ts,
 * migrations/20261207000000_reservation_owner.ts).
 *
 * A decision is opened with the keys of every row it may reserve (one new message id per addressed
 * inbox, made here, before anything is read), the clock's time it decides by, and its instant, which
 * is the `reserved_at` of those rows;
 * it closes once its answer was handed to the MTA, once it is known to have reserved nothing, or once
 * what it reserved was withdrawn. A snapshot names the keys of every open decision and an instant
 * `answeredBefore`: every decision opened later has an instant at or after it. So a row of this
 * process that a snapshot neither names nor dates at or after `answeredBefore` was answered (or
 * withdrawn) before that snapshot; one answered within the snapshot's millisecond counts as not (it is
 * released with the ghosts if the process dies, as what it answers after its last heartbeat is).
 * Instants never go back, even if the wall clock is stepped back: each is at least the last one. What
 * a decision decides by is the clock's own time: a clock stepped back after running ahead dated
 * decisions ahead, and refused mail for inboxes with minutes left as expired, until it caught up.
 *
 * The process is named by `incarnation` (a random uuid per start). A decision names it only if the
 * heartbeat row existed when it opened and the process was not stopping (owner): a row naming a milter
 * without one would never be swept, and one reserved after a stop removed the row neither.
 */
import type { Clock } from './clock.ts';
import type { MessageKey } from './ports.ts';

export interface Decision {
  /** The incarnation to write on its reservations, or null (left to the clean-up job). */
  readonly owner: string | null;
  /** What it decides by (expiry, purge): the clock's time when it opened. */
  readonly now: Date;
  /**
   * The `reserved_at` of what it reserves: its time, or the last instant handed out if the clock went
   * back since (a heartbeat may have named that instant: a row dated before it would pass for answered).
   */
  readonly reservedAt: Date;
  /** Every row it may reserve; it reserves some, all or none of them. */
  readonly keys: readonly MessageKey[];
  /** More calls do nothing. */
  close(): void;
}

export interface LedgerSnapshot {
  answeredBefore: Date;
  open: MessageKey[];
}

/** A decision outside any ledger: no owner, nothing tracked. */
export function untrackedDecision(keys: MessageKey[], now: Date): Decision {
  return { owner: null, now, reservedAt: now, keys, close() {} };
}

export class ReservationLedger {
  readonly incarnation: string;
  readonly #clock: Clock;
  readonly #open = new Set<readonly MessageKey[]>();
  #last = 0;
  #registered = false;
  #retired = false;

  constructor(incarnation: string, clock: Clock) {
    this.incarnation = incarnation;
    this.#clock = clock;
  }

  /** The heartbeat row is written (again, after a stop): decisions opened from now on name this process. */
  registered(): void {
    this.#registered = true;
    this.#retired = false;
  }

  /** The process is stopping: decisions opened from now on name no process. */
  retire(): void {
    this.#retired = true;
  }

  open(keys: MessageKey[]): Decision {
    // First: a clock that refuses (clock-check.ts) must not leave keys behind that nothing closes.
    const now = this.#clock.now();
    const reservedAt = this.#after(now);
    const tracked: readonly MessageKey[] = [...keys];
    this.#open.add(tracked);
    return {
      owner: this.#registered && !this.#retired ? this.incarnation : null,
      now,
      reservedAt,
      keys: tracked,
      close: () => {
        this.#open.delete(tracked);
      },
    };
  }

  snapshot(): LedgerSnapshot {
    const open: MessageKey[] = [];
    for (const keys of this.#open) open.push(...keys);
    return { answeredBefore: this.#answeredBefore(), open };
  }

  get openCount(): number {
    return this.#open.size;
  }

  /**
   * The instant a snapshot names. While the clock refuses (core/clock-check.ts) no decision opens, so
   * the last instant handed out still bounds every later one: the heartbeat goes on with it (failing,
   * it got this live process taken for dead and its reservations released), and does not read the
   * time behind the refusing clock, which would date later reservations by it.
   */
  #answeredBefore(): Date {
    let now: Date;
    try {
      now = this.#clock.now();
    } catch {
      return new Date(this.#last);
    }
    return this.#after(now);
  }

  /** `now`, or the last instant handed out if the clock went back since; it becomes the last. */
  #after(now: Date): Date {
    this.#last = Math.max(this.#last, now.getTime());
    return new Date(this.#last);
  }
}
