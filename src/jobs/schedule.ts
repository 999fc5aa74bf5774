/**
 * schedule - runs the lifecycle jobs one after another every SWEEP_INTERVAL_SECONDS, with node-cron in
 * UTC (no daylight-saving gaps). In this process a sweep still running when the next one is due makes
 * that one skipped (noOverlap; node-cron logs a warning through our log); across processes each job's
 * advisory lock keeps two runs of a job apart. Ticks follow the system clock; each job takes its "now"
 * from the injected Clock.
 */
import cron from 'node-cron';
import type { Log } from '../log.ts';
import type { Job, JobReport } from './job.ts';

/** The cron expression (with seconds) for an interval that divides a minute, an hour or a day (config). */
export function cronExpression(intervalSeconds: number): string {
  if (intervalSeconds < 60) return `*/${intervalSeconds} * * * * *`;
  if (intervalSeconds % 3600 === 0) {
    const hours = intervalSeconds / 3600;
    return hours === 24 ? '0 0 0 * * *' : `0 0 */${hours} * * *`;
  }
  return `0 */${intervalSeconds / 60} * * * *`;
}

/**
 * Runs every job once, in order, until `signal` is aborted. A job that fails has logged it; the next
 * job still runs.
 */
export async function sweep(jobs: Job[], signal?: AbortSignal): Promise<JobReport[]> {
  const reports: JobReport[] = [];
  for (const job of jobs) {
    if (signal?.aborted) break;
    reports.push(await job.run(signal));
  }
  return reports;
}

export interface Schedule {
  /** Stops scheduling; a sweep in progress stops after its current batch, and close waits for it. */
  close(): Promise<void>;
}

export function startSchedule(jobs: Job[], intervalSeconds: number, log: Log): Schedule {
  const stopping = new AbortController();
  let running: Promise<unknown> = Promise.resolve();
  const task = cron.schedule(
    cronExpression(intervalSeconds),
    () => {
      const current = sweep(jobs, stopping.signal);
      running = current;
      return current;
    },
    {
      name: 'sweep',
      noOverlap: true,
      timezone: 'UTC',
      logger: {
        info: () => {},
        debug: () => {},
        warn: (message) => log({ level: 'warn', msg: `node-cron: ${message}` }),
        error: (message) => log({ level: 'error', msg: `node-cron: ${String(message)}` }),
      },
    },
  );
  return {
    async close() {
      stopping.abort();
      await task.destroy();
      await running;
    },
  };
}
