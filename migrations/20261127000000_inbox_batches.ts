/**
 * Batch forms of the mail path's two per-inbox writes, for storage/inbox-batcher.ts:
 * - reserve_message_batch: several single-inbox reservations for one inbox, each exactly as
 *   reserve_messages makes it (quota checked against what the ones before it reserved), in the order given.
 * - store_whole_messages: several whole messages (each at most one chunk) for one inbox, each stored
 *   exactly as store_whole_message stores it, in the order given.
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

    CREATE FUNCTION store_whole_messages(
      p_inbox_id text, p_new_message_ids text[], p_queue_ids text[], p_envelope_froms text[],
      p_nows timestamptz[], p_data bytea, p_lengths int4[], p_chunk_bytes integer, p_sha256s bytea,
      p_from_names text[], p_from_addresses text[], p_subjects text[], p_internet_message_ids text[],
      p_authentications jsonb[]
    ) RETURNS TABLE (n integer, out_kind text, out_message_id text) LANGUAGE plpgsql VOLATILE AS $fn$
    DECLARE
      v_offset integer := 0;
    BEGIN
      FOR i IN 1 .. coalesce(cardinality(p_queue_ids), 0) LOOP
        n := i;
        SELECT s.out_kind, s.out_message_id INTO out_kind, out_message_id
          FROM store_whole_message(p_inbox_id, p_new_message_ids[i], p_queue_ids[i], p_envelope_froms[i],
            p_nows[i], substring(p_data FROM v_offset + 1 FOR p_lengths[i]), p_chunk_bytes,
            substring(p_sha256s FROM (i - 1) * 32 + 1 FOR 32), p_from_names[i], p_from_addresses[i],
            p_subjects[i], p_internet_message_ids[i], p_authentications[i]) s;
        v_offset := v_offset + p_lengths[i];
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
