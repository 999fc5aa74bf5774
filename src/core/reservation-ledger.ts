/**
 * reservation-ledger - which of this milter process's end-of-data decisions are still between their
 * start and the answer reaching Postfix (or their reservations' withdrawal), so that its heartbeat can
 * say "every reservation I made before this instant was answered" (mail/orphan-sweep.ts,
 * migrations/20261207000000_reservation_owner.ts).
 *
 * A decision is opened before its reservation is made and closed once its answer was handed to the
 * MTA, once it reserved nothing, or once what it reserved was withdrawn. answeredBefore() is the
 * oldest open decision's start, or now when none is open; times come from the clock the reservations'
 * `reserved_at` is written with, and a decision opens before MessageAdmission reads that clock.
 *
 * The process is named by `incarnation` (a random uuid per start). Its reservations carry it only once
 * its heartbeat row exists (owner()): a row naming a milter without one would never be swept.
 */
import type { Clock } from './clock.ts';

export class ReservationLedger {
  readonly incarnation: string;
  readonly #clock: Clock;
  readonly #open = new Map<number, Date>();
  #next = 0;
  #registered = false;

  constructor(incarnation: string, clock: Clock) {
    this.incarnation = incarnation;
    this.#clock = clock;
  }

  /** The owner to write on a reservation now: the incarnation once its heartbeat row exists, else null. */
  owner(): string | null {
    return this.#registered ? this.incarnation : null;
  }

  /** The heartbeat row is written: from now on reservations name this process. */
  registered(): void {
    this.#registered = true;
  }

  /** Opens a decision; the returned function closes it (more calls do nothing). */
  open(): () => void {
    const key = this.#next++;
    this.#open.set(key, this.#clock.now());
    return () => {
      this.#open.delete(key);
    };
  }

  /** The instant before which every reservation this process made has been answered or withdrawn. */
  answeredBefore(): Date {
    let oldest: Date | null = null;
    for (const opened of this.#open.values()) if (!oldest || opened < oldest) oldest = opened;
    return oldest ?? this.#clock.now();
  }

  /** How many decisions are open (for tests and the log). */
  get openCount(): number {
    return this.#open.size;
  }
}
