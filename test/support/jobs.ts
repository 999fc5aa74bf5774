/**
 * jobs - the lifecycle jobs over a test harness's database and fake clock, with their log lines kept,
 * and what the tests read back from the tables (counts only: the jobs' effects are physical, so the
 * tests look at the rows the API no longer shows).
 */
import { TOKENS } from '../../src/container.ts';
import type { SweeperStore } from '../../src/core/ports.ts';
import type { Job, JobReport, SweepLimits } from '../../src/jobs/job.ts';
import { createJobs } from '../../src/jobs/jobs.ts';
import { sweep } from '../../src/jobs/schedule.ts';
import type { LogLine } from '../../src/log.ts';
import type { Database } from '../../src/storage/database.ts';
import type { Harness } from './harness.ts';

export type JobName =
  | 'release-reservations'
  | 'expire-inboxes'
  | 'delete-messages'
  | 'purge-inboxes'
  | 'drop-tombstones'
  | 'drop-rejections'
  | 'forget-idempotency'
  | 'drop-rate-buckets';

export interface TestJobs {
  jobs: Job[];
  /** Every line the jobs logged, oldest first. */
  lines: LogLine[];
  run(name: JobName): Promise<JobReport>;
  /** Every job once, in sweep order. */
  sweep(): Promise<JobReport[]>;
}

/** The jobs as the jobs entry builds them, over `h`'s container (or another one, as a second process). */
export function testJobs(
  h: Pick<Harness, 'container' | 'clock' | 'config'>,
  limits: Partial<SweepLimits> = {},
  wallClock?: () => number,
): TestJobs {
  const lines: LogLine[] = [];
  const store = h.container.resolve<SweeperStore>(TOKENS.SweeperStore);
  const jobs = createJobs(store, h.clock, h.config, (line) => lines.push(line), limits, wallClock);
  const byName = new Map(jobs.map((job) => [job.name, job]));
  return {
    jobs,
    lines,
    run(name) {
      const job = byName.get(name);
      if (!job) throw new Error(`no job ${name}`);
      return job.run();
    },
    sweep: () => sweep(jobs),
  };
}

/** One number from the test database (a count, a sum). */
export async function scalar(
  h: Pick<Harness, 'container'>,
  sql: string,
  values: unknown[] = [],
): Promise<number> {
  const db = h.container.resolve<Database>(TOKENS.Database);
  const result = await db.pool.query(sql, values);
  return Number(Object.values(result.rows[0] ?? { n: 0 })[0] ?? 0);
}

/** Rows and content bytes an inbox holds in each table the jobs clean. */
export async function footprint(h: Pick<Harness, 'container'>, inboxId: string) {
  const count = (table: string) => scalar(h, `SELECT count(*) FROM ${table} WHERE inbox_id = $1`, [inboxId]);
  return {
    inboxes: await count('inboxes'),
    credentials: await count('credentials'),
    messages: await count('messages'),
    undeleted: await scalar(h, "SELECT count(*) FROM messages WHERE inbox_id = $1 AND state <> 'deleted'", [
      inboxId,
    ]),
    chunks: await count('message_chunks'),
    chunkBytes: await scalar(
      h,
      'SELECT coalesce(sum(octet_length(data)), 0) FROM message_chunks WHERE inbox_id = $1',
      [inboxId],
    ),
    rejections: await count('rejections'),
    extendKeys: await count('extend_idempotency'),
    rateBuckets: await count('rate_buckets'),
  };
}

/** Stores `count` messages spread over `inboxIds`, `parallel` at a time, through the mail path's store. */
export async function deliverMany(
  h: Pick<Harness, 'deliver'>,
  inboxIds: string[],
  count: number,
  raw: (i: number) => string,
  parallel = 16,
): Promise<void> {
  let next = 0;
  const worker = async () => {
    for (let i = next++; i < count; i = next++) {
      await h.deliver(inboxIds[i % inboxIds.length] as string, raw(i));
    }
  };
  await Promise.all(Array.from({ length: parallel }, worker));
}
