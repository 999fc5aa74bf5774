/**
 * job - what every lifecycle job shares (STYLE 17, DESIGN decision 9):
 * - one run at a time across every process: a Postgres advisory lock named after the job; a run that
 *   finds it held does nothing and says so;
 * - one "now" per run, from the injected clock (never the database's); but a run whose host's clock
 *   (the wall clock) is more than MAX_CLOCK_SKEW_SECONDS off PostgreSQL's does nothing and fails: what
 *   a job deletes cannot come back, and a host clock 20 minutes ahead would purge live inboxes;
 * - work in bounded batches (rows and bytes per statement), at most `maxBatches` per run: a run that
 *   reaches the cap stops and the next run carries on;
 * - one structured log line per run with its counts, batches and duration. `run()` never rejects;
 * - a run asked to stop (its signal aborted) stops before its next batch; so does a run whose lock's
 *   session failed (a renewal that could not reach PostgreSQL), and it is reported failed: another
 *   process may hold the lock by then.
 *
 * A job only makes physical what readers already apply, so a run that is late, skipped, repeated or cut
 * short (a crash between batches) changes no answer the API or the SMTP side gives.
 */
import type { Clock } from '../core/clock.ts';
import { clockSkewMs, describeSkew } from '../core/clock-check.ts';
import type { SweeperStore } from '../core/ports.ts';
import type { RetentionSettings } from '../core/retention.ts';
import type { Log } from '../log.ts';

export interface SweepLimits {
  /** Rows one statement marks or deletes (SWEEP_BATCH_SIZE). */
  batchRows: number;
  /** Bytes of message content one statement frees (at least one message's). */
  batchBytes: number;
  /** Statements (batches) one run makes at most. */
  maxBatches: number;
  /** Pages of `batchRows` rows read per run by a job going round a table (lost copies, rate buckets). */
  scanPages: number;
}

export interface JobDeps {
  store: SweeperStore;
  clock: Clock;
  /** The host's clock, compared with PostgreSQL's before each run (Date.now; tests set it off). */
  wallClock?: () => number;
  log: Log;
  limits: SweepLimits;
  settings: RetentionSettings;
}

export type Counts = Record<string, number>;

export interface JobReport {
  job: string;
  /**
   * False when another process held the job's lock (or it could not be taken), or when the run stopped
   * before its first batch because the host's clock is off PostgreSQL's (then `error` says so).
   */
  ran: boolean;
  counts: Counts;
  batches: number;
  /** False when the run stopped at its cap or failed: there may be more to do. */
  complete: boolean;
  durationMs: number;
  error?: string;
}

export interface Job {
  readonly name: string;
  /** One run; `signal` aborted makes it stop before its next batch (incomplete, nothing half done). */
  run(signal?: AbortSignal): Promise<JobReport>;
}

/** One run of a job, as its body sees it. */
export interface Run {
  readonly now: Date;
  readonly limits: SweepLimits;
  add(counts: Counts): void;
  /**
   * Calls `batch` while it answers true (there may be more) and the run has batches left and is not
   * asked to stop. Answers false when it was cut short; from then on every `repeat` of the run does
   * nothing.
   */
  repeat(batch: () => Promise<boolean>): Promise<boolean>;
}

class RunState implements Run {
  readonly now: Date;
  readonly limits: SweepLimits;
  readonly counts: Counts = {};
  readonly #signal: AbortSignal | undefined;
  batches = 0;
  cut = false;

  constructor(now: Date, limits: SweepLimits, signal: AbortSignal | undefined) {
    this.now = now;
    this.limits = limits;
    this.#signal = signal;
  }

  add(counts: Counts): void {
    for (const [name, n] of Object.entries(counts)) this.counts[name] = (this.counts[name] ?? 0) + n;
  }

  async repeat(batch: () => Promise<boolean>): Promise<boolean> {
    for (;;) {
      if (this.cut || this.batches >= this.limits.maxBatches || this.#signal?.aborted) {
        this.cut = true;
        return false;
      }
      this.batches++;
      if (!(await batch())) return true;
    }
  }
}

export function defineJob(name: string, deps: JobDeps, body: (run: Run) => Promise<void>): Job {
  return {
    name,
    async run(signal?: AbortSignal): Promise<JobReport> {
      const started = performance.now();
      let state: RunState | undefined;
      let ran = false;
      let error: string | undefined;
      try {
        const outcome = await deps.store.exclusively(name, async (lost) => {
          await checkClock(deps);
          state = new RunState(
            deps.clock.now(),
            deps.limits,
            signal ? AbortSignal.any([signal, lost]) : lost,
          );
          await body(state);
          if (lost.aborted) throw new Error(`lost the job's lock: ${String(lost.reason)}`);
        });
        ran = outcome.ran;
      } catch (failure) {
        ran = state !== undefined;
        error = failure instanceof Error ? failure.message : String(failure);
      }
      const report: JobReport = {
        job: name,
        ran,
        counts: state?.counts ?? {},
        batches: state?.batches ?? 0,
        complete: ran && !error && !state?.cut,
        durationMs: Math.round(performance.now() - started),
        ...(error === undefined ? {} : { error }),
      };
      deps.log({
        ...(error ? { level: 'error' } : {}),
        msg: error ? 'job failed' : ran ? 'job ran' : 'job skipped: running in another process',
        job: name,
        ...report.counts,
        batches: report.batches,
        complete: report.complete,
        duration_ms: report.durationMs,
        ...(error === undefined ? {} : { error }),
      });
      return report;
    },
  };
}

async function checkClock(deps: JobDeps): Promise<void> {
  const skewMs = await clockSkewMs(deps.wallClock ?? Date.now, () => deps.store.databaseClockMs());
  if (skewMs !== 0) throw new Error(`${describeSkew(skewMs)}: nothing done; set the clocks right (NTP)`);
}
