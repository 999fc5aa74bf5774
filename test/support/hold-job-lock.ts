/**
 * hold-job-lock - a process that takes a job's lock and never finishes its run, for the test of the
 * lock's lease (test/jobs/locking.test.ts), which then stops this process with SIGSTOP:
 *   node test/support/hold-job-lock.ts <database url> <job> <lease ms>
 * Prints `locked` once it holds the lock.
 */

import { Database } from '../../src/storage/database.ts';
import { PgSweeperStore } from '../../src/storage/sweeper-store.ts';

const [url, job, lease] = process.argv.slice(2);
if (!url || !job || !lease) throw new Error('usage: hold-job-lock.ts <database url> <job> <lease ms>');
const store = new PgSweeperStore(new Database(url, 2), { lockLeaseMs: Number(lease) });
const outcome = store.exclusively(job, async () => {
  process.stdout.write('locked\n');
  await new Promise(() => {});
});
void outcome.then((o) => {
  if (!o.ran) process.stdout.write('busy\n');
});
