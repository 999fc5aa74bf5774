/**
 * The idempotency key's index leads with queue_id: UNIQUE (queue_id, inbox_id) instead of
 * (inbox_id, queue_id). The constraint is the same (ON CONFLICT (inbox_id, queue_id) infers it whatever
 * the column order); what changes is that no lookup by (inbox_id, message_id) can plan it any more.
 *
 * Why: with the statistics of a new or freshly filled table (reltuples 0), the key lookups the delivery
 * path makes through cached generic plans (the foreign-key check of every message_chunks insert, the
 * UPDATE in finish_delivery) cost the same through the primary key and through (inbox_id, queue_id) with
 * message_id as a filter, and Postgres took the latter: each walked every message of the inbox under the
 * inbox's row lock. With all mail to one inbox (mail-bench) a delivery's lock hold grew with the inbox, and
 * those plans stay cached until the next ANALYZE. A queue_id-first index cannot serve `inbox_id = $1`
 * alone. test/storage/key-plans.test.ts checks the plans on an empty table.
 */
import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  await knex.raw(`
    ALTER TABLE messages DROP CONSTRAINT messages_inbox_id_queue_id_key,
      ADD CONSTRAINT messages_queue_id_inbox_id_key UNIQUE (queue_id, inbox_id);
  `);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw(`
    ALTER TABLE messages DROP CONSTRAINT messages_queue_id_inbox_id_key,
      ADD CONSTRAINT messages_inbox_id_queue_id_key UNIQUE (inbox_id, queue_id);
  `);
}
