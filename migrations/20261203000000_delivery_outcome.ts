/**
 * finish_delivery_outcome: finish_delivery (migration 20261202000000) saying what became of the
 * delivery: 'stored', or 'cancelled' / 'expired' when it kept nothing because the inbox had ended;
 * and store_whole_message_outcome / store_whole_messages_outcome, the whole-message store functions
 * passing that on as their out_kind. The receiver calls these three.
 *
 * Why: those two cases answered like a stored message. The receiver's 250 reply (which Postfix logs as
 * `status=sent (250 2.0.0 <id> stored)`), its delivery log line and its metrics all said `stored` for a
 * message that was deleted in the same step, so an operator tracing a lost-looking message was told it
 * was kept. The reply is still 250 (DESIGN decision 1: never a 5xx after the message was accepted);
 * only what it says changes (core/delivery-service.ts).
 *
 * Expand, not change (STYLE; docker/README "Upgrades"): the functions a receiver started before this
 * migration calls keep their names, results and behaviour (changing finish_delivery's result type
 * failed its prepared statements, "cached plan must not change result type", and gave its store
 * functions out_kind values it does not know). The old three can be dropped once no such receiver
 * runs. The bodies are those of 20261202000000 (finish_delivery) and 20261123000000 / 20261127000000
 * (the store functions) with the result passed on.
 */
import type { Knex } from 'knex';

const ARGUMENTS = `
      p_inbox_id text, p_message_id text, p_size int8, p_chunk_bytes integer, p_sha256 bytea,
      p_from_name text, p_from_address text, p_subject text, p_internet_message_id text,
      p_authentication jsonb, p_now timestamptz`;
const ARGUMENT_TYPES = 'text, text, int8, integer, bytea, text, text, text, text, jsonb, timestamptz';

const FINISH = `
    CREATE FUNCTION finish_delivery_outcome(${ARGUMENTS}
    ) RETURNS text LANGUAGE plpgsql VOLATILE AS $fn$
    DECLARE
      v_position int8;
      v_cancelled_at timestamptz;
      v_expires_at timestamptz;
    BEGIN
      UPDATE inboxes SET event_seq = event_seq + 1, version = version + 1 WHERE inbox_id = p_inbox_id
        RETURNING event_seq, cancelled_at, expires_at INTO v_position, v_cancelled_at, v_expires_at;
      IF v_cancelled_at IS NOT NULL THEN
        DELETE FROM message_chunks WHERE inbox_id = p_inbox_id AND message_id = p_message_id;
        UPDATE messages m SET state = 'deleted', deleted_at = p_now, deleted_reason = 'cancelled'
          WHERE m.inbox_id = p_inbox_id AND m.message_id = p_message_id;
        RETURN 'cancelled';
      END IF;
      IF v_expires_at + interval '60 seconds' <= p_now THEN
        DELETE FROM message_chunks WHERE inbox_id = p_inbox_id AND message_id = p_message_id;
        RETURN 'expired';
      END IF;
      UPDATE messages m SET state = 'stored', size_bytes = p_size, chunk_bytes = p_chunk_bytes,
          sha256 = p_sha256, from_name = p_from_name, from_address = p_from_address, subject = p_subject,
          internet_message_id = p_internet_message_id, authentication = p_authentication, received_at = p_now,
          position = v_position
        WHERE m.inbox_id = p_inbox_id AND m.message_id = p_message_id;
      RETURN 'stored';
    END
    $fn$;`;

const STORE = `
    CREATE FUNCTION store_whole_message_outcome(
      p_inbox_id text, p_new_message_id text, p_queue_id text, p_envelope_from text, p_now timestamptz,
      p_data bytea, p_chunk_bytes integer, p_sha256 bytea, p_from_name text, p_from_address text,
      p_subject text, p_internet_message_id text, p_authentication jsonb,
      OUT out_kind text, OUT out_message_id text
    ) LANGUAGE plpgsql VOLATILE AS $fn$
    DECLARE
      v_state text;
    BEGIN
      SELECT b.out_message_id, b.out_state INTO out_message_id, v_state
        FROM begin_delivery(p_inbox_id, p_new_message_id, p_queue_id, p_envelope_from, p_now) b;
      IF v_state <> 'in_flight' THEN
        out_kind := 'duplicate';
        RETURN;
      END IF;
      IF octet_length(p_data) > 0 THEN
        INSERT INTO message_chunks (inbox_id, message_id, seq, data) VALUES (p_inbox_id, out_message_id, 0, p_data);
      END IF;
      out_kind := finish_delivery_outcome(p_inbox_id, out_message_id, octet_length(p_data), p_chunk_bytes,
        p_sha256, p_from_name, p_from_address, p_subject, p_internet_message_id, p_authentication, p_now);
    END
    $fn$;

    CREATE FUNCTION store_whole_messages_outcome(
      p_inbox_id text, p_new_message_ids text[], p_queue_ids text[], p_envelope_froms text[],
      p_nows timestamptz[], p_data bytea, p_lengths int4[], p_chunk_bytes integer, p_sha256s bytea,
      p_from_names text[], p_from_addresses text[], p_subjects text[], p_internet_message_ids text[],
      p_authentications jsonb[]
    ) RETURNS TABLE (n integer, out_kind text, out_message_id text) LANGUAGE plpgsql VOLATILE AS $fn$
    DECLARE
      v_count integer := coalesce(cardinality(p_queue_ids), 0);
      v_ids text[] := '{}';
      v_kinds text[] := '{}';
      v_id text;
      v_state text;
      v_data bytea;
      v_offset integer := 0;
    BEGIN
      FOR i IN 1 .. v_count LOOP
        SELECT b.out_message_id, b.out_state INTO v_id, v_state
          FROM begin_delivery(p_inbox_id, p_new_message_ids[i], p_queue_ids[i], p_envelope_froms[i], p_nows[i]) b;
        -- A queue id seen earlier in this batch is that message's duplicate, as it would be after it.
        v_kinds := v_kinds || CASE WHEN v_state = 'in_flight' AND NOT (v_id = ANY (v_ids))
                                   THEN 'stored' ELSE 'duplicate' END;
        v_ids := v_ids || v_id;
      END LOOP;
      FOR i IN 1 .. v_count LOOP
        n := i;
        out_message_id := v_ids[i];
        out_kind := v_kinds[i];
        v_data := substring(p_data FROM v_offset + 1 FOR p_lengths[i]);
        v_offset := v_offset + p_lengths[i];
        IF out_kind = 'stored' THEN
          IF octet_length(v_data) > 0 THEN
            INSERT INTO message_chunks (inbox_id, message_id, seq, data) VALUES (p_inbox_id, out_message_id, 0, v_data);
          END IF;
          out_kind := finish_delivery_outcome(p_inbox_id, out_message_id, octet_length(v_data),
            p_chunk_bytes, substring(p_sha256s FROM (i - 1) * 32 + 1 FOR 32), p_from_names[i],
            p_from_addresses[i], p_subjects[i], p_internet_message_ids[i], p_authentications[i], p_nows[i]);
        END IF;
        RETURN NEXT;
      END LOOP;
    END
    $fn$;`;

export async function up(knex: Knex): Promise<void> {
  await knex.raw(`${FINISH}
${STORE}`);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw(`
    DROP FUNCTION store_whole_messages_outcome(text, text[], text[], text[], timestamptz[], bytea, int4[],
      integer, bytea, text[], text[], text[], text[], jsonb[]);
    DROP FUNCTION store_whole_message_outcome(text, text, text, text, timestamptz, bytea, integer, bytea,
      text, text, text, text, jsonb);
    DROP FUNCTION finish_delivery_outcome(${ARGUMENT_TYPES});
  `);
}
