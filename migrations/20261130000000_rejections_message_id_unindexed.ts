/**
 * Drops rejections_message_id, the btree index on (inbox_id, reason, internet_message_id).
 *
 * Why: the Message-ID is the sender's text, of any length. A btree entry holds at most 2704 bytes after
 * compression, so a rejection whose Message-ID was a few KB of random text failed to insert ("index row
 * size exceeds btree version 4 maximum"), the milter answered 451 on every retry, and a refusal the
 * contract makes definite (quota, opted out: 555) never became one, nor was its event recorded.
 *
 * Nothing needed the index: the one statement that compares Message-IDs (MessageStore.recordRejection)
 * counts all of one inbox's held events (at most MAX_REJECTIONS) through the primary key.
 */
import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  await knex.raw('DROP INDEX rejections_message_id');
}

export async function down(knex: Knex): Promise<void> {
  // A Message-ID the index could not hold is forgotten first (its retries then count as new events),
  // or the index could not be built.
  await knex.raw(`
    UPDATE rejections SET internet_message_id = NULL WHERE octet_length(internet_message_id) > 2000;
    CREATE INDEX rejections_message_id ON rejections (inbox_id, reason, internet_message_id)
      WHERE internet_message_id IS NOT NULL
  `);
}
