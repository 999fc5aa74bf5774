/**
 * jobs - the lifecycle jobs (contract sections 3 and 8; DESIGN decision 9): inbox expiry and purge,
 * message deletion (downloaded, unclaimed, lost), tombstones, rejection retention, provision keys,
 * reservations that were never delivered, rate buckets of purged inboxes.
 *
 * Listens on:   nothing. Runs every job in turn every SWEEP_INTERVAL_SECONDS (node-cron, UTC).
 * Reads/writes: marks messages deleted and deletes their chunks; deletes messages, inboxes (with their
 *               credentials, rejections and extend keys), rejections, provision idempotency records and
 *               rate buckets. Each statement touches at most SWEEP_BATCH_SIZE rows (and 64 MiB of content).
 * On failure:   a failing job logs `job failed` and the next sweep tries again; every batch is its own
 *               transaction, so a crash leaves nothing half done. Any number of processes may run this:
 *               a job whose advisory lock is held elsewhere is skipped. Correctness never waits on a job
 *               (readers apply every timer themselves); a stopped job costs only space.
 * On SIGTERM:   stops scheduling; a sweep in progress stops after its current batch (each batch is one
 *               transaction), then the process exits.
 * Observes:     one log line and one metrics report per job run (outcome, rows, bytes, time).
 * Security:     reads no message content and logs only ids and counts.
 */
import type { DependencyContainer } from 'tsyringe';
import type { Config } from '../config/config.ts';
import { TOKENS } from '../container.ts';
import type { Job } from '../jobs/job.ts';
import { type Schedule, startSchedule } from '../jobs/schedule.ts';
import type { Log } from '../log.ts';
import type { Metrics } from '../ops/metrics.ts';

export function startJobs(container: DependencyContainer, log: Log): Schedule {
  const config = container.resolve<Config>(TOKENS.Config);
  const metrics = container.resolve<Metrics>(TOKENS.Metrics);
  const jobs = container.resolve<Job[]>(TOKENS.Jobs).map(
    (job): Job => ({
      name: job.name,
      run: async (signal) => {
        const report = await job.run(signal);
        metrics.jobRun(report);
        return report;
      },
    }),
  );
  return startSchedule(jobs, config.sweepIntervalSeconds, log);
}
