/**
 * inbox_used_bytes' sum of an inbox's overdue messages (20261125000000), which every reservation and
 * every policy check with SIZE= runs, the reservation under the inbox's row lock, gets a key no other
 * index has: messages_overdue is rebuilt on `(inbox_id || '')` (same rows, same predicate) and the
 * sum asks for `(inbox_id || '') = p_inbox_id`, which neither the primary key (inbox_id, message_id)
 * nor messages_undeleted (inbox_id) can serve.
 *
 * Why: the sum's `state <> 'deleted'` implies messages_undeleted's predicate (20261201000000), and on
 * a table whose statistics say it is empty the two indexes cost the same. A connection that planned
 * the sum then (a daemon started on a new database, or anywhere autovacuum is off) kept a generic
 * plan that read every message of the inbox on every call: in mail-bench, PostgreSQL's CPU per
 * message went from 2.4 to 8.5 ms over four rounds into one inbox, and every delivery to it queued
 * behind the lock. The primary key could be taken the same way. Redefining messages_undeleted instead
 * (on `state IN (...)`, tried first) made that index look a hundredth of its size without statistics,
 * and the poll listing took it. test/storage/usage-plans.test.ts plans the sum on an empty table and
 * reads it after the inbox fills; test/jobs/indexes.test.ts plans the deployed sum with statistics.
 *
 * The index is small (held messages past their listing), but its build reads the table under a SHARE
 * lock that holds deliveries back meanwhile: the messages table is bounded by the contract's timers,
 * as for 20261201000000.
 */
import type { Knex } from 'knex';

const usedBytes = (inboxCondition: string) => `
    CREATE OR REPLACE FUNCTION inbox_used_bytes(p_inbox_id text, p_held_bytes int8, p_now timestamptz)
      RETURNS int8 LANGUAGE plpgsql STABLE AS $fn$
    BEGIN
      RETURN p_held_bytes - coalesce((SELECT sum(size_bytes) FROM messages
        WHERE ${inboxCondition} AND state <> 'deleted' AND delete_after IS NOT NULL
          AND delete_after <= p_now), 0)::int8;
    END
    $fn$;`;

const overdueIndex = (key: string) => `
    CREATE INDEX messages_overdue ON messages (${key}, delete_after)
      WHERE state <> 'deleted' AND delete_after IS NOT NULL;`;

export async function up(knex: Knex): Promise<void> {
  await knex.raw(`
    DROP INDEX messages_overdue;
    ${overdueIndex(`(inbox_id || '')`)}
    ${usedBytes(`(inbox_id || '') = p_inbox_id`)}
  `);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw(`
    DROP INDEX messages_overdue;
    ${overdueIndex('inbox_id')}
    ${usedBytes('inbox_id = p_inbox_id')}
  `);
}
