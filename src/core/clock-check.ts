/**
 * clock-check - the host's clock against PostgreSQL's. Every time rule is evaluated on the host's
 * clock (clock.ts), against rows other hosts wrote; a clock far off PostgreSQL's decides wrongly what
 * cannot be undone. The jobs refuse to run (jobs/job.ts); every daemon runs on a CheckedClock,
 * which refuses to tell the time while the last reading was off, so every decision that needs "now"
 * fails and its adapter answers as for any internal failure: for mail a temporary failure, never a
 * lost or bounced message; for the API a 500. (A receiver 20 minutes fast answered `250 not kept:
 * inbox expired` for deliveries into inboxes with minutes left, and kept nothing: lost, if the owner
 * extended the inbox.)
 */
import { type Clock, systemClock } from './clock.ts';

/**
 * How far the host's clock may be from PostgreSQL's. Within it, the margins kept cover the difference
 * (expire-inboxes' EXPIRE_SETTLE_SECONDS and the store's late-delivery minute are 60).
 */
export const MAX_CLOCK_SKEW_SECONDS = 30;

/**
 * The host's clock minus PostgreSQL's (ms), or 0 when within MAX_CLOCK_SKEW_SECONDS (widened by half
 * the reading's round trip, which it cannot tell apart).
 */
export async function clockSkewMs(
  wall: () => number,
  databaseClockMs: () => Promise<number>,
): Promise<number> {
  const before = wall();
  const database = await databaseClockMs();
  const after = wall();
  const skewMs = (before + after) / 2 - database;
  return Math.abs(skewMs) <= MAX_CLOCK_SKEW_SECONDS * 1000 + (after - before) / 2 ? 0 : skewMs;
}

/** `this host's clock is N s ahead of PostgreSQL's (more than 30 s)`. */
export function describeSkew(skewMs: number): string {
  const seconds = Math.round(Math.abs(skewMs) / 1000);
  return (
    `this host's clock is ${seconds} s ${skewMs > 0 ? 'ahead of' : 'behind'} PostgreSQL's (more than ` +
    `${MAX_CLOCK_SKEW_SECONDS} s)`
  );
}

export class ClockSkewError extends Error {}

/** A clock that throws ClockSkewError while `skewed` is set (by watchClock). */
export class CheckedClock implements Clock {
  readonly #inner: Clock;
  /** What is wrong with the clock (watchClock's last reading), or null. */
  skewed: string | null = null;

  constructor(inner: Clock = systemClock) {
    this.#inner = inner;
  }

  now(): Date {
    if (this.skewed !== null) throw new ClockSkewError(`${this.skewed}: set the clocks right (NTP)`);
    return this.#inner.now();
  }
}

export interface ClockWatch {
  /** The first reading (resolved even if it failed). */
  readonly first: Promise<void>;
  stop(): void;
}

/**
 * Reads the skew now and every `intervalMs` into `clock.skewed`, logging each change once. A reading
 * that fails (PostgreSQL away) changes nothing: the daemons' own database errors answer meanwhile.
 */
export function watchClock(
  clock: CheckedClock,
  databaseClockMs: () => Promise<number>,
  log: (line: Record<string, unknown>) => void,
  options: { intervalMs?: number; retryMs?: number; wall?: () => number } = {},
): ClockWatch {
  const wall = options.wall ?? Date.now;
  let known = false;
  let stopped = false;
  let retry: NodeJS.Timeout | undefined;
  const read = async () => {
    let skewMs: number;
    try {
      skewMs = await clockSkewMs(wall, databaseClockMs);
    } catch {
      // Until a first reading succeeds, tried again every second, not every interval.
      if (!known && !stopped) {
        retry = setTimeout(() => void read(), options.retryMs ?? 1_000);
        retry.unref();
      }
      return;
    }
    known = true;
    const skewed = skewMs === 0 ? null : describeSkew(skewMs);
    if (skewed === clock.skewed) return;
    if (skewed === null) log({ msg: "clock agrees with PostgreSQL's again" });
    else if (clock.skewed === null)
      log({
        level: 'error',
        msg: `${skewed}: what needs the time fails until the clocks agree (mail deferred with 4xx, API 500)`,
      });
    clock.skewed = skewed;
  };
  const timer = setInterval(() => void read(), options.intervalMs ?? 30_000);
  timer.unref();
  return {
    first: read(),
    stop: () => {
      stopped = true;
      clearInterval(timer);
      clearTimeout(retry);
    },
  };
}
