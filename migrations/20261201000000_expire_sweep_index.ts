/**
 * The expiry sweep's index (src/storage/sweeper-store.ts EXPIRE_PICK_SQL): for each expired inbox that
 * still holds something, its messages not yet deleted. Without it the planner walked the messages
 * table per inbox, or joined from it, reading every tombstone of every inbox awaiting its purge on each
 * sweep (a review measured 150-355 ms per idle sweep at 0.6-1.4 million rows; with it, 7.5 ms).
 * test/jobs/indexes.test.ts checks that the poll listing and the usage count do not take it.
 * The messages table is bounded by the contract's timers, so a plain (locking) build takes moments.
 */
import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  await knex.raw(`CREATE INDEX messages_undeleted ON messages (inbox_id) WHERE state <> 'deleted'`);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('DROP INDEX messages_undeleted');
}
