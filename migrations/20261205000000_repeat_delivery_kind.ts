/**
 * repeat_delivery_kind, and the whole-message store functions of migration 20261203000000 using it:
 * what a delivery of a queue id the inbox already has a row for came to. A row deleted without ever
 * being stored (no event position) by the cancel, the expiry sweep or the reservation release kept
 * nothing of this delivery either ('cancelled', 'expired', 'released'); any other is a redelivery of
 * what was stored ('duplicate', "already stored").
 *
 * Why: such deliveries answered "already stored" (the commonest: a message reserved before its inbox
 * was cancelled, delivered after). A row that was stored and later deleted (a lost 250 reply, then
 * the cancel or the expiry) stays 'duplicate': it was stored. The streaming store calls the function
 * itself (storage/message-store.ts).
 *
 * A migration of its own, not an edit of 20261203000000, which databases had already applied.
 */
import type { Knex } from 'knex';

const REPEAT = `
    CREATE FUNCTION repeat_delivery_kind(p_inbox_id text, p_message_id text, p_state text)
    RETURNS text LANGUAGE sql STABLE AS $fn$
      SELECT CASE WHEN p_state = 'deleted' AND m.position IS NULL
                       AND m.deleted_reason IN ('cancelled', 'expired', 'released')
                  THEN m.deleted_reason ELSE 'duplicate' END
        FROM messages m WHERE m.inbox_id = p_inbox_id AND m.message_id = p_message_id
    $fn$;`;

/** 20261203000000's store functions, with repeat_delivery_kind for a row that is not in flight. */
const STORE = `
    CREATE OR REPLACE FUNCTION store_whole_message_outcome(
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
        out_kind := coalesce(repeat_delivery_kind(p_inbox_id, out_message_id, v_state), 'duplicate');
        RETURN;
      END IF;
      IF octet_length(p_data) > 0 THEN
        INSERT INTO message_chunks (inbox_id, message_id, seq, data) VALUES (p_inbox_id, out_message_id, 0, p_data);
      END IF;
      out_kind := finish_delivery_outcome(p_inbox_id, out_message_id, octet_length(p_data), p_chunk_bytes,
        p_sha256, p_from_name, p_from_address, p_subject, p_internet_message_id, p_authentication, p_now);
    END
    $fn$;

    CREATE OR REPLACE FUNCTION store_whole_messages_outcome(
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
        v_kinds := v_kinds || CASE WHEN v_state = 'in_flight' AND NOT (v_id = ANY (v_ids)) THEN 'stored'
                                   WHEN v_state <> 'in_flight'
                                   THEN coalesce(repeat_delivery_kind(p_inbox_id, v_id, v_state), 'duplicate')
                                   ELSE 'duplicate' END;
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

/** The same as 20261203000000 made them. */
const STORE_BEFORE = `
    CREATE OR REPLACE FUNCTION store_whole_message_outcome(
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

    CREATE OR REPLACE FUNCTION store_whole_messages_outcome(
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
  await knex.raw(`${REPEAT}
${STORE}`);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw(`${STORE_BEFORE}
    DROP FUNCTION repeat_delivery_kind(text, text, text);`);
}
