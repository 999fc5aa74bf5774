/**
 * Batch forms of the mail path's two per-inbox writes, for storage/inbox-batcher.ts:
 * - reserve_message_batch: several single-inbox reservations for one inbox, each exactly as
 *   reserve_messages makes it (quota checked against what the ones before it reserved), in the order given.
 * - store_whole_messages: several whole messages (each at most one chunk) for one inbox, each stored
 *   as store_whole_message stores it, in the order given (its two halves in two passes, for lock order).
 * Each is one statement, so one transaction. Rows come back numbered from 1 in the order given.
 *
 * Why: both writes take the inbox row's lock (held_bytes; the event position) and keep it until their
 * commit has reached the disk. Mail arriving together for one inbox (mail-bench sends 20 sessions to
 * one) queued on that lock inside Postgres: with 20 concurrent 10 KiB deliveries to one inbox, Postgres
 * spent 2.6 ms per store against 0.7 alone, and 0.8 ms per reservation against 0.5. The milter and the
 * receiver now keep one statement per inbox in flight and send what queued meanwhile as one call: one
 * lock, one commit, one disk flush.
 *
 * The messages' bytes come as one bytea and their lengths, the SHA-256 digests as one bytea of 32 bytes
 * each, so that no message is hex-encoded into an array literal.
 */
import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  await knex.raw(`
    CREATE FUNCTION reserve_message_batch(
      p_inbox_id text, p_message_ids text[], p_queue_ids text[], p_sizes int8[], p_envelope_froms text[],
      p_nows timestamptz[]
    ) RETURNS TABLE (n integer, outcome text) LANGUAGE plpgsql VOLATILE AS $fn$
    BEGIN
      FOR i IN 1 .. coalesce(cardinality(p_queue_ids), 0) LOOP
        n := i;
        outcome := (reserve_messages(ARRAY[p_inbox_id], ARRAY[p_message_ids[i]], p_queue_ids[i],
          ARRAY[p_sizes[i]], p_envelope_froms[i], p_nows[i]))[1];
        RETURN NEXT;
      END LOOP;
    END
    $fn$;

    -- In two passes, so that locks come in the order a single store, the jobs and the API take them:
    -- first every message's row (begin_delivery, in the order given), then the inbox row (the first
    -- finish_delivery). Storing message by message would hold the inbox row while locking the next
    -- message's row, and deadlock with a job or API call holding that row and waiting for the inbox.
    CREATE FUNCTION store_whole_messages(
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
          -- As store_whole_message does after begin_delivery.
          IF octet_length(v_data) > 0 THEN
            INSERT INTO message_chunks (inbox_id, message_id, seq, data) VALUES (p_inbox_id, out_message_id, 0, v_data);
          END IF;
          PERFORM finish_delivery(p_inbox_id, out_message_id, octet_length(v_data), p_chunk_bytes,
            substring(p_sha256s FROM (i - 1) * 32 + 1 FOR 32), p_from_names[i], p_from_addresses[i],
            p_subjects[i], p_internet_message_ids[i], p_authentications[i], p_nows[i]);
        END IF;
        RETURN NEXT;
      END LOOP;
    END
    $fn$;
  `);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw(`
    DROP FUNCTION reserve_message_batch(text, text[], text[], int8[], text[], timestamptz[]);
    DROP FUNCTION store_whole_messages(text, text[], text[], text[], timestamptz[], bytea, int4[], integer,
      bytea, text[], text[], text[], text[], jsonb[]);
  `);
}
