/**
 * reservation-ledger - which of this milter process's end-of-data decisions are between their start
 * and the answer reaching Postfix (or their reservations' withdrawal), so that its heartbeat can say
 * exactly which of its reservations may never have been answered (mail/orphan-sweep.ts,
 * migrations/20261207000000_reservation_owner.ts).
 *
 * A decision opens before MessageAdmission reads its clock, learns the keys of the rows it reserves
 * before the reservation is sent (reserving), and closes once its answer was handed to the MTA, once it
 * reserved nothing, or once what it reserved was withdrawn. A snapshot names the keys of every open
 * decision, and `answeredBefore`: the start of the oldest open decision that has no keys yet, or now.
 * A row of this process is answered if it is not among those keys and was reserved before that
 * instant: a decision without keys reserves with `reserved_at` at or after its start, one with keys is
 * named. A decision stuck with keys (a withdrawal retried for minutes) holds back nothing.
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
  /** The keys of the rows it reserves, named before the reservation is sent; empty before. */
  readonly keys: readonly MessageKey[];
  reserving(keys: MessageKey[]): void;
  /** More calls do nothing. */
  close(): void;
}

export interface LedgerSnapshot {
  answeredBefore: Date;
  open: MessageKey[];
}

/** A decision outside any ledger: no owner, nothing tracked. */
export function untrackedDecision(): Decision {
  let keys: readonly MessageKey[] = [];
  return {
    owner: null,
    get keys() {
      return keys;
    },
    reserving(named) {
      keys = named;
    },
    close() {},
  };
}

interface OpenDecision {
  opened: Date;
  keys: MessageKey[] | null;
}

export class ReservationLedger {
  readonly incarnation: string;
  readonly #clock: Clock;
  readonly #open = new Set<OpenDecision>();
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

  open(): Decision {
    const entry: OpenDecision = { opened: this.#clock.now(), keys: null };
    this.#open.add(entry);
    const owner = this.#registered && !this.#retired ? this.incarnation : null;
    return {
      owner,
      get keys() {
        return entry.keys ?? [];
      },
      reserving: (keys) => {
        entry.keys = keys;
      },
      close: () => {
        this.#open.delete(entry);
      },
    };
  }

  snapshot(): LedgerSnapshot {
    let oldest: Date | null = null;
    const open: MessageKey[] = [];
    for (const entry of this.#open) {
      if (entry.keys) open.push(...entry.keys);
      else if (!oldest || entry.opened < oldest) oldest = entry.opened;
    }
    return { answeredBefore: oldest ?? this.#clock.now(), open };
  }

  get openCount(): number {
    return this.#open.size;
  }
}
