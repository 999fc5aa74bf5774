/**
 * A delivery that completes more than a minute after its inbox expired stores nothing and leaves its
 * reservation as the expiry found it, for the expiry sweep to delete.
 *
 * Why: an expired inbox's status keeps its final counts, taken at expires_at (contract section 3;
 * storage/usage.ts), and DESIGN decision 9 has the jobs only clean up. A message the milter reserved
 * before expiry counts there with its reserved size. When Postfix delivered it after expires_at but
 * before the expiry sweep ran (60 s later), finish_delivery stored it and replaced the reserved size
 * with the real one, so the final counts shrank after expiry; had the sweep run first, the delivery
 * was a duplicate and they stayed. Now finish_delivery, on an inbox expired at the delivery's `p_now`,
 * removes the chunks just written and leaves the row in flight, as if the delivery had come after the
 * sweep: the sweep then marks it deleted (reason 'expired') and the counts are the same either way. A
 * cancelled inbox keeps the behaviour of migrations/20261128000000_cancelled_delivery.ts. The receiver
 * still answers 250: the message was delivered, and the inbox's mail is deleted at expiry.
 *
 * The minute is the expiry sweep's own margin (EXPIRE_SETTLE_SECONDS, src/jobs/expire-inboxes.ts): the
 * receiver's clock may run ahead of the API's, where an extend can still keep the inbox live. Within
 * it the message is stored as before (the sweep has not run yet, so the order question does not arise).
 */
import type { Knex } from 'knex';

const SIGNATURE = `
      p_inbox_id text, p_message_id text, p_size int8, p_chunk_bytes integer, p_sha256 bytea,
      p_from_name text, p_from_address text, p_subject text, p_internet_message_id text,
      p_authentication jsonb, p_now timestamptz`;

const STORE = `
      UPDATE messages m SET state = 'stored', size_bytes = p_size, chunk_bytes = p_chunk_bytes,
          sha256 = p_sha256, from_name = p_from_name, from_address = p_from_address, subject = p_subject,
          internet_message_id = p_internet_message_id, authentication = p_authentication, received_at = p_now,
          position = v_position
        WHERE m.inbox_id = p_inbox_id AND m.message_id = p_message_id;`;

const CANCELLED = `
      IF v_cancelled_at IS NOT NULL THEN
        DELETE FROM message_chunks WHERE inbox_id = p_inbox_id AND message_id = p_message_id;
        UPDATE messages m SET state = 'deleted', deleted_at = p_now, deleted_reason = 'cancelled'
          WHERE m.inbox_id = p_inbox_id AND m.message_id = p_message_id;
        RETURN;
      END IF;`;

export async function up(knex: Knex): Promise<void> {
  await knex.raw(`
    CREATE OR REPLACE FUNCTION finish_delivery(${SIGNATURE}
    ) RETURNS void LANGUAGE plpgsql VOLATILE AS $fn$
    DECLARE
      v_position int8;
      v_cancelled_at timestamptz;
      v_expires_at timestamptz;
    BEGIN
      UPDATE inboxes SET event_seq = event_seq + 1, version = version + 1 WHERE inbox_id = p_inbox_id
        RETURNING event_seq, cancelled_at, expires_at INTO v_position, v_cancelled_at, v_expires_at;
      ${CANCELLED}
      IF v_expires_at + interval '60 seconds' <= p_now THEN
        DELETE FROM message_chunks WHERE inbox_id = p_inbox_id AND message_id = p_message_id;
        RETURN;
      END IF;
      ${STORE}
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
      v_cancelled_at timestamptz;
    BEGIN
      UPDATE inboxes SET event_seq = event_seq + 1, version = version + 1 WHERE inbox_id = p_inbox_id
        RETURNING event_seq, cancelled_at INTO v_position, v_cancelled_at;
      ${CANCELLED}
      ${STORE}
    END
    $fn$;
  `);
}
