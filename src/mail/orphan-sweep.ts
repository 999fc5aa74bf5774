/**
 * orphan-sweep - the milter's heartbeat, and the release of reservations a dead milter never answered
 * (migrations/20261207000000_reservation_owner.ts explains why).
 *
 * Every `intervalMs` each milter process writes its heartbeat with its ledger's snapshot (the keys
 * of the reservations it has not answered yet, and the instant from which what it reserves is not yet
 * named: core/reservation-ledger.ts); every `sweepIntervalMs`, in a loop of its own, it releases what
 * milters silent for `leaseSeconds` may have left unanswered. Any live milter sweeps (the rows of the
 * dead are taken with SKIP LOCKED), so a milter that was killed is cleaned up by its replacement or by
 * a sibling within about a lease.
 *
 * What a dead milter answered in its last interval, after its last heartbeat, is released with the
 * ghosts: nothing tells them apart. Its delivery is still stored, but its quota is not held until
 * then, so another message may take that room meanwhile and the inbox end up over its quota by at
 * most what the milter answered in that second. Keeping them instead would keep the ghosts: quota
 * held until RESERVATION_TTL_SECONDS and the sender's retry refused 555, a bounce caused by our own
 * failure. A short interval keeps the first small; it costs one small statement a second.
 *
 * A heartbeat that fails is logged and tried again at the next interval; PostgreSQL away means no
 * reservation is made either. Why the lease is 60 s: a milter's event loop is never blocked that long
 * while it works, and a ghost released within a minute is as good as at once for a sender retrying
 * after a 4xx.
 */
import type { ReservationLedger } from '../core/reservation-ledger.ts';
import type { Log } from '../log.ts';
import type { PgMilterIncarnations } from '../storage/milter-incarnations.ts';

export interface OrphanSweepTiming {
  /** Between heartbeats. */
  intervalMs: number;
  /** Between sweeps; each runs on its own, so one waiting on a lock never delays a heartbeat. */
  sweepIntervalMs: number;
  leaseSeconds: number;
}

export const ORPHAN_SWEEP: OrphanSweepTiming = {
  intervalMs: 1_000,
  sweepIntervalMs: 5_000,
  leaseSeconds: 60,
};

export interface OrphanSweep {
  /** Settles after the first heartbeat and sweep (whether they worked). */
  readonly started: Promise<void>;
  /**
   * Stops both loops, and decisions opened from now on name no process (their rows are left to the
   * clean-up job); then, with no decision open, removes the heartbeat row (everything was answered),
   * else writes one last heartbeat. Best effort: what fails is left to the sweep.
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
  let stopped = false;
  const beat = async () => {
    await incarnations.beat(ledger.incarnation, ledger.snapshot());
    if (!stopped) ledger.registered();
  };
  const sweep = async () => {
    const release = await incarnations.releaseOrphans(timing.leaseSeconds);
    if (release.released === 0) return;
    released(release.released);
    log({
      level: 'warn',
      msg: 'released the reservations of a milter that stopped without answering them',
      milters: release.dead,
      reservations: release.released,
      bytes: release.bytes,
    });
  };
  const beats = repeat('milter heartbeat', beat, timing.intervalMs, () => stopped, log);
  const sweeps = repeat('orphan sweep', sweep, timing.sweepIntervalMs, () => stopped, log);

  return {
    started: beats.first.then(() => sweeps.first),
    async stop() {
      stopped = true;
      ledger.retire();
      await Promise.all([beats.stop(), sweeps.stop()]);
      const last = ledger.openCount === 0 ? incarnations.forget(ledger.incarnation) : beat();
      await last.catch(() => {});
    },
  };
}

/**
 * Runs `work` now and then `everyMs` after each run ends, until `stopped()`; a failure is logged once
 * (and its recovery), and the next run tries again.
 */
function repeat(
  what: string,
  work: () => Promise<void>,
  everyMs: number,
  stopped: () => boolean,
  log: Log,
): { first: Promise<void>; stop(): Promise<void> } {
  let timer: NodeJS.Timeout | undefined;
  let failing = false;
  const run = async () => {
    try {
      await work();
      if (failing) log({ msg: `${what} works again` });
      failing = false;
    } catch (error) {
      if (!failing) {
        const message = error instanceof Error ? error.message : String(error);
        log({ level: 'warn', msg: `${what} failed; trying again`, error: message });
      }
      failing = true;
    }
  };
  const next = () => {
    if (stopped()) return;
    timer = setTimeout(() => {
      running = run().finally(next);
    }, everyMs);
    timer.unref();
  };
  let running = run().finally(next);
  const first = running;
  return {
    first,
    async stop() {
      clearTimeout(timer);
      await running;
    },
  };
}
