/**
 * The delivery steps as server-side functions, so that each step the mail path takes is one round trip
 * (src/storage/message-store.ts calls them):
 *
 * - `counts_in_usage`: the rule for which messages count in an inbox's usage at an instant; the one
 *   definition, read by storage/usage.ts's USAGE_WHERE and by reserve_messages. An IMMUTABLE SQL
 *   expression, so the planner inlines it and plans are those of the expression written out.
 * - `reserve_messages`: the milter's quota reservation in every recipient inbox, all or nothing
 *   (DESIGN decision 4). It locks each inbox row in the order given (callers sort by inbox id), reads
 *   the usage after the lock in a fresh snapshot (a VOLATILE plpgsql function takes one per statement
 *   under READ COMMITTED, so it sees every reservation committed before the lock was granted), and
 *   inserts only when every inbox has room. Holding the inbox lock no longer spans client round trips:
 *   with all mail for one inbox, lock waits were most of a delivery's latency.
 * - `begin_delivery` and `finish_delivery`: the LMTP delivery's first and last steps, inside the
 *   caller's transaction: the in-flight row (inserted if the milter's reservation is gone) and its row
 *   lock; then the next event position and visibility (DESIGN decision 8). The streaming path calls
 *   them around its chunk inserts; `store_whole_message` is both with the one chunk between, for a
 *   message that fits in one chunk (most mail).
 */
import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  await knex.raw(`
    CREATE FUNCTION counts_in_usage(
      p_reserved_at timestamptz, p_deleted_at timestamptz, p_delete_after timestamptz, p_as_of timestamptz
    ) RETURNS boolean LANGUAGE sql IMMUTABLE AS $fn$
      SELECT p_reserved_at <= p_as_of
        AND (p_deleted_at IS NULL OR p_deleted_at > p_as_of)
        AND (p_delete_after IS NULL OR p_delete_after > p_as_of)
    $fn$;

    CREATE FUNCTION reserve_messages(
      p_inbox_ids text[], p_message_ids text[], p_queue_id text, p_sizes int8[], p_envelope_from text,
      p_now timestamptz
    ) RETURNS text[] LANGUAGE plpgsql VOLATILE AS $fn$
    DECLARE
      v_quota int8;
      v_present boolean;
      v_used int8;
      v_outcomes text[] := '{}';
    BEGIN
      FOR i IN 1 .. coalesce(cardinality(p_inbox_ids), 0) LOOP
        SELECT quota_bytes INTO v_quota FROM inboxes WHERE inbox_id = p_inbox_ids[i] FOR UPDATE;
        IF NOT FOUND THEN
          RAISE EXCEPTION 'no inbox %', p_inbox_ids[i];
        END IF;
        SELECT EXISTS (SELECT 1 FROM messages WHERE inbox_id = p_inbox_ids[i] AND queue_id = p_queue_id),
               (SELECT coalesce(sum(size_bytes), 0)::int8 FROM messages
                WHERE inbox_id = p_inbox_ids[i] AND counts_in_usage(reserved_at, deleted_at, delete_after, p_now))
          INTO v_present, v_used;
        v_outcomes := v_outcomes || CASE
          WHEN v_present THEN 'exists'
          WHEN v_used + p_sizes[i] > v_quota THEN 'over_quota'
          ELSE 'reserved' END;
      END LOOP;
      IF 'over_quota' = ANY (v_outcomes) THEN
        RETURN v_outcomes;
      END IF;
      FOR i IN 1 .. coalesce(cardinality(p_inbox_ids), 0) LOOP
        IF v_outcomes[i] = 'reserved' THEN
          -- Usage changes: the inbox's version moves (core/usage-cache.ts).
          UPDATE inboxes SET version = version + 1 WHERE inbox_id = p_inbox_ids[i];
          INSERT INTO messages (inbox_id, message_id, queue_id, state, size_bytes, envelope_from, reserved_at)
            VALUES (p_inbox_ids[i], p_message_ids[i], p_queue_id, 'in_flight', p_sizes[i], p_envelope_from, p_now);
        END IF;
      END LOOP;
      RETURN v_outcomes;
    END
    $fn$;

    CREATE FUNCTION begin_delivery(
      p_inbox_id text, p_new_message_id text, p_queue_id text, p_envelope_from text, p_now timestamptz,
      OUT out_message_id text, OUT out_state text
    ) LANGUAGE plpgsql VOLATILE AS $fn$
    BEGIN
      INSERT INTO messages (inbox_id, message_id, queue_id, state, size_bytes, envelope_from, reserved_at)
        VALUES (p_inbox_id, p_new_message_id, p_queue_id, 'in_flight', 0, p_envelope_from, p_now)
        ON CONFLICT (inbox_id, queue_id) DO NOTHING;
      -- Locks this delivery's row: a concurrent redelivery of the same queue id waits, then sees 'stored'.
      SELECT m.message_id, m.state INTO out_message_id, out_state FROM messages m
        WHERE m.inbox_id = p_inbox_id AND m.queue_id = p_queue_id FOR UPDATE;
      IF NOT FOUND THEN
        RAISE EXCEPTION 'delivery row missing after insert';
      END IF;
    END
    $fn$;

    CREATE FUNCTION finish_delivery(
      p_inbox_id text, p_message_id text, p_size int8, p_chunk_bytes integer, p_sha256 bytea,
      p_from_name text, p_from_address text, p_subject text, p_internet_message_id text,
      p_authentication jsonb, p_now timestamptz
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

    CREATE FUNCTION store_whole_message(
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
      PERFORM finish_delivery(p_inbox_id, out_message_id, octet_length(p_data), p_chunk_bytes, p_sha256,
        p_from_name, p_from_address, p_subject, p_internet_message_id, p_authentication, p_now);
      out_kind := 'stored';
    END
    $fn$;
  `);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw(`
    DROP FUNCTION store_whole_message(text, text, text, text, timestamptz, bytea, integer, bytea, text, text,
      text, text, jsonb);
    DROP FUNCTION finish_delivery(text, text, int8, integer, bytea, text, text, text, text, jsonb, timestamptz);
    DROP FUNCTION begin_delivery(text, text, text, text, timestamptz);
    DROP FUNCTION reserve_messages(text[], text[], text, int8[], text, timestamptz);
    DROP FUNCTION counts_in_usage(timestamptz, timestamptz, timestamptz, timestamptz);
  `);
}
