/**
 * messages_undeleted (20261201000000) is rebuilt on `('' || inbox_id)` with its predicate written
 * `('' || state) <> 'deleted'` (the same rows), and only its own statements say those words
 * (UNDELETED_OF in src/storage/rows.ts: the expiry sweep's pick and cancel's walks of an inbox).
 *
 * Why: on `inbox_id` and `state <> 'deleted'` it was a candidate for every statement asking for an
 * inbox in a state other than deleted (the poll listing, markDownloaded, recordLost, the overdue sum
 * until 20261209000000), and on a table whose statistics say it is empty it costs what their own index
 * costs. A connection that planned one of them then kept a plan that read every message of the inbox
 * not yet deleted on every call (a review: the listing 383-389 buffers, markDownloaded 371-383, at
 * 14,000 of them); with only the key its own, a plan made after an ANALYZE of a small table still
 * ANDed the whole index into the listing's scan (another review: 282 buffers per poll at 188,000 such
 * messages). Its words are not messages_overdue's `(inbox_id || '')` and `(state || '')`: the
 * overdue sum's rows are all among these, and in the same words the sum could read either index. The
 * primary key wins the remaining ties (it has the lowest OID), and it is the right index for those
 * statements.
 * test/storage/key-plans.test.ts plans them with their own index hidden; test/jobs/indexes.test.ts
 * plans the expiry pick.
 *
 * Built CONCURRENTLY outside a transaction (config below) under a new name, then swapped in. Each
 * step can be run again after a failure.
 */
import type { Knex } from 'knex';

export const config = { transaction: false };

async function swap(knex: Knex, key: string, undeleted: string): Promise<void> {
  await knex.raw('DROP INDEX CONCURRENTLY IF EXISTS messages_undeleted_next');
  await knex.raw(`CREATE INDEX CONCURRENTLY messages_undeleted_next ON messages (${key}) WHERE ${undeleted}`);
  await knex.raw('DROP INDEX CONCURRENTLY IF EXISTS messages_undeleted');
  await knex.raw('ALTER INDEX messages_undeleted_next RENAME TO messages_undeleted');
}

export async function up(knex: Knex): Promise<void> {
  await swap(knex, `('' || inbox_id)`, `('' || state) <> 'deleted'`);
}

export async function down(knex: Knex): Promise<void> {
  await swap(knex, 'inbox_id', `state <> 'deleted'`);
}
