/**
 * A delivery that completes after its inbox was cancelled is deleted in the same step, instead of being
 * stored into the cancelled inbox.
 *
 * Why: the contract (section 3) deletes a cancelled inbox's mail at once and refuses its mail at SMTP.
 * The policy daemon refuses at RCPT and the milter at end of data, but a message the milter reserved
 * before the cancel is already accepted and in Postfix's queue; the LMTP receiver then stored it, and it
 * stayed, unreadable (410), until the inbox was purged at the end of its paid lifetime. Now
 * finish_delivery, which both store paths end with (store_whole_message, the streaming transaction, and
 * the batch), sees the cancel on the inbox row it already updates, removes the message's chunks and
 * leaves a tombstone as the cancel does (state 'deleted', reason 'cancelled'). The receiver still
 * answers 250: the message was delivered and, as the contract says, deleted.
 */
import type { Knex } from 'knex';

const SIGNATURE = `
      p_inbox_id text, p_message_id text, p_size int8, p_chunk_bytes integer, p_sha256 bytea,
      p_from_name text, p_from_address text, p_subject text, p_internet_message_id text,
      p_authentication jsonb, p_now timestamptz`;

export async function up(knex: Knex): Promise<void> {
  await knex.raw(`
    CREATE OR REPLACE FUNCTION finish_delivery(${SIGNATURE}
    ) RETURNS void LANGUAGE plpgsql VOLATILE AS $fn$
    DECLARE
      v_position int8;
      v_cancelled_at timestamptz;
    BEGIN
      UPDATE inboxes SET event_seq = event_seq + 1, version = version + 1 WHERE inbox_id = p_inbox_id
        RETURNING event_seq, cancelled_at INTO v_position, v_cancelled_at;
      IF v_cancelled_at IS NOT NULL THEN
        DELETE FROM message_chunks WHERE inbox_id = p_inbox_id AND message_id = p_message_id;
        UPDATE messages m SET state = 'deleted', deleted_at = p_now, deleted_reason = 'cancelled'
          WHERE m.inbox_id = p_inbox_id AND m.message_id = p_message_id;
        RETURN;
      END IF;
      UPDATE messages m SET state = 'stored', size_bytes = p_size, chunk_bytes = p_chunk_bytes,
          sha256 = p_sha256, from_name = p_from_name, from_address = p_from_address, subject = p_subject,
          internet_message_id = p_internet_message_id, authentication = p_authentication, received_at = p_now,
          position = v_position
        WHERE m.inbox_id = p_inbox_id AND m.message_id = p_message_id;
    END
    $fn$;
  `);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw(`
    CREATE OR REPLACE FUNCTION finish_delivery(${SIGNATURE}
    ) RETURNS void LANGUAGE plpgsql VOLATILE AS $fn$
    DECLARE
      v_position int8;
    BEGIN
      UPDATE inboxes SET event_seq = event_seq + 1, version = version + 1 WHERE inbox_id = p_inbox_id
        RETURNING event_seq INTO v_position;
      UPDATE messages m SET state = 'stored', size_bytes = p_size, chunk_bytes = p_chunk_bytes,
          sha256 = p_sha256, from_name = p_from_name, from_address = p_from_address, subject = p_subject,
          internet_message_id = p_internet_message_id, authentication = p_authentication, received_at = p_now,
          position = v_position
        WHERE m.inbox_id = p_inbox_id AND m.message_id = p_message_id;
    END
    $fn$;
  `);
}
