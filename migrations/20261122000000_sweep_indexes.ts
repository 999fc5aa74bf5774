/**
 * Indexes the lifecycle jobs' sweeps need (src/storage/sweeper-store.ts); the others they use came with
 * the initial schema (inboxes_expires_at, messages_in_flight, rejections_listed_at,
 * provision_idempotency_created_at).
 *
 * Each predicate names a condition the poll listing (`m.state = 'stored' AND (m.delete_after IS NULL OR
 * m.delete_after > $4)`) and the usage rule (storage/usage.ts, no state at all) cannot imply as a whole,
 * so neither can use these indexes for its own scan: an earlier `(delete_after) WHERE state = 'stored'`
 * made the listing walk 40k index entries. test/jobs/indexes.test.ts checks the plans.
 * The messages table is bounded by the contract's timers, so a plain (locking) build takes moments.
 */
import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  await knex.raw(`
    -- delete-messages: stored messages whose timer (first listing or download) has run out
    CREATE INDEX messages_delete_due ON messages (delete_after)
      WHERE state = 'stored' AND delete_after IS NOT NULL;
    -- drop-tombstones: deleted messages whose 410 window has passed
    CREATE INDEX messages_deleted_at ON messages (deleted_at) WHERE state = 'deleted';
  `);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('DROP INDEX messages_delete_due, messages_deleted_at');
}
