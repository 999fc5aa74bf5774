/**
 * hold-sweeper-batch - a process that runs one job and stops within its first batch, its work done but
 * not committed, for the test of the batch's lease (test/jobs/frozen-batch.test.ts), which then stops
 * this process with SIGSTOP:
 *   node test/support/hold-sweeper-batch.ts <database url> <lease ms> <job> <now> <settings json>
 * Prints `holding` once the batch holds its row locks, and carries on when a line comes on stdin.
 * Then prints the run's log line (JSON) and exits.
 */
import { once } from 'node:events';
import type pg from 'pg';
import { createJobs, type JobSettings } from '../../src/jobs/jobs.ts';
import { Database } from '../../src/storage/database.ts';
import { PgSweeperStore } from '../../src/storage/sweeper-store.ts';

const [url, lease, job, now, settings] = process.argv.slice(2);
if (!url || !lease || !job || !now || !settings)
  throw new Error('usage: hold-sweeper-batch.ts <database url> <lease ms> <job> <now> <settings json>');

/** A pool whose first transaction waits, before its COMMIT, for a line on stdin. */
class HeldDatabase extends Database {
  #held = false;

  override async transaction<T>(fn: (client: pg.PoolClient) => Promise<T>): Promise<T> {
    return super.transaction(async (client) => {
      const result = await fn(client);
      if (!this.#held) {
        this.#held = true;
        process.stdout.write('holding\n');
        await once(process.stdin, 'data');
      }
      return result;
    });
  }
}

const store = new PgSweeperStore(new HeldDatabase(url, 3), { lockLeaseMs: Number(lease) });
const clock = { now: () => new Date(now) };
const log = (line: object) => process.stdout.write(`${JSON.stringify(line)}\n`);
const jobs = createJobs(store, clock, JSON.parse(settings) as JobSettings, log);
const chosen = jobs.find((j) => j.name === job);
if (!chosen) throw new Error(`no job ${job}`);
await chosen.run();
process.exit(0);
