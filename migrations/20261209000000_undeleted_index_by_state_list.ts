/**
 * messages_undeleted (20261201000000) is redefined on `state IN ('in_flight', 'stored')`, and the
 * statements that walk an inbox's messages not yet deleted name the states so (UNDELETED in
 * src/storage/rows.ts): the same rows (the state check allows only these two and 'deleted').
 *
 * Why: inbox_used_bytes' sum of an inbox's overdue messages (20261125000000), which every reservation
 * runs under the inbox's row lock, says `state <> 'deleted'`, so the old predicate made
 * messages_undeleted a candidate for it too, and on a table whose statistics say it is empty the two
 * indexes cost the same. A connection that planned it then (a daemon started on a new database, or
 * anywhere autovacuum is off) kept a generic plan that read every message of the inbox on every
 * reservation: in mail-bench, PostgreSQL's CPU per message went from 2.4 to 8.5 ms over four rounds
 * into one inbox, and all deliveries to it queued behind the lock. `state <> 'deleted'` does not imply
 * the new predicate, so only messages_overdue (or the primary key) can serve that sum.
 * test/storage/usage-plans.test.ts plans it on an empty table and reads it after the inbox fills.
 */
import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  await knex.raw(`
    DROP INDEX messages_undeleted;
    CREATE INDEX messages_undeleted ON messages (inbox_id) WHERE state IN ('in_flight', 'stored');
  `);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw(`
    DROP INDEX messages_undeleted;
    CREATE INDEX messages_undeleted ON messages (inbox_id) WHERE state <> 'deleted';
  `);
}
