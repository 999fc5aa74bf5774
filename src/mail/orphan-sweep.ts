/**
 * orphan-sweep - the milter's heartbeat, and the release of reservations a dead milter never answered
 * (migrations/20261207000000_reservation_owner.ts explains why).
 *
 * Every `intervalMs` each milter process writes its heartbeat with its ledger's answeredBefore()
 * (core/reservation-ledger.ts), then releases what milters silent for `leaseSeconds` reserved from
 * `marginSeconds` before their last answeredBefore on. Any live milter sweeps (the rows of the dead
 * are taken with SKIP LOCKED), so a milter that was killed is cleaned up by its replacement or by a
 * sibling within about a lease and an interval.
 *
 * The margin covers what the ledger's instant cannot: a wall clock stepped back between a decision's
 * opening and its reservation, and an answer handed to the socket in the same turn of the event loop
 * as the heartbeat. Releasing a reservation that was answered is harmless (its delivery is stored all
 * the same; only the quota check that reservation made is no longer held for it); keeping a ghost is
 * not (it holds quota until RESERVATION_TTL_SECONDS and turns the sender's retry into a 555).
 *
 * A heartbeat that fails is logged and tried again at the next interval; PostgreSQL away means no
 * reservation is made either. Why the lease is 60 s: a milter's event loop is never blocked that long
 * while it works, and a ghost within a minute is as good as at once for a sender retrying after 4xx.
 */
import type { ReservationLedger } from '../core/reservation-ledger.ts';
import type { Log } from '../log.ts';
import type { PgMilterIncarnations } from '../storage/milter-incarnations.ts';

export interface OrphanSweepTiming {
  intervalMs: number;
  leaseSeconds: number;
  marginSeconds: number;
}

export const ORPHAN_SWEEP: OrphanSweepTiming = { intervalMs: 10_000, leaseSeconds: 60, marginSeconds: 10 };

export interface OrphanSweep {
  /** Settles after the first heartbeat and sweep (whether they worked). */
  readonly started: Promise<void>;
  /**
   * Stops the timer; then, with no decision open, removes the heartbeat row (everything was answered:
   * a sweep would only release answered reservations within the margin), else writes one last
   * heartbeat. Best effort: what fails is left to the sweep.
   */
  stop(): Promise<void>;
}

export function startOrphanSweep(
  ledger: ReservationLedger,
  incarnations: PgMilterIncarnations,
  log: Log,
  timing: OrphanSweepTiming = ORPHAN_SWEEP,
  released: (count: number) => void = () => {},
): OrphanSweep {
  let timer: NodeJS.Timeout | undefined;
  let stopped = false;
  let failing = false;
  let running: Promise<void> = Promise.resolve();

  const beat = async () => {
    await incarnations.beat(ledger.incarnation, ledger.answeredBefore());
    ledger.registered();
  };
  const tick = async () => {
    try {
      await beat();
      const release = await incarnations.releaseOrphans(timing.leaseSeconds, timing.marginSeconds);
      if (release.released > 0) {
        released(release.released);
        log({
          level: 'warn',
          msg: 'released the reservations of a milter that stopped without answering them',
          milters: release.dead,
          reservations: release.released,
          bytes: release.bytes,
        });
      }
      if (failing) log({ msg: 'milter heartbeat works again', incarnation: ledger.incarnation });
      failing = false;
    } catch (error) {
      if (!failing) {
        log({
          level: 'warn',
          msg: 'milter heartbeat or orphan sweep failed; trying again',
          incarnation: ledger.incarnation,
          error: error instanceof Error ? error.message : String(error),
        });
      }
      failing = true;
    }
  };
  const schedule = () => {
    if (stopped) return;
    timer = setTimeout(() => {
      running = tick().finally(schedule);
    }, timing.intervalMs);
    timer.unref();
  };
  running = tick().finally(schedule);

  return {
    started: running,
    async stop() {
      stopped = true;
      clearTimeout(timer);
      await running;
      const last = ledger.openCount === 0 ? incarnations.forget(ledger.incarnation) : beat();
      await last.catch(() => {});
    },
  };
}
