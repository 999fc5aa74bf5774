/**
 * Reservations name the milter process that made them, so that the ones a dead milter never answered
 * can be released at once (src/mail/orphan-sweep.ts), not RESERVATION_TTL_SECONDS later.
 *
 * Why: a milter that dies between its reservation's commit and its answer (kill -9, the OOM killer, a
 * container stopped under load: a review's crash runs left 7 ghosts in 14 kills) leaves a row Postfix
 * never heard of. Postfix answered the client 4xx and queued nothing; the row held quota six days and
 * turned the sender's retry into a nearly full inbox into `555 mailbox quota exceeded`, a bounce caused
 * by our own failure. Nothing in the row tells a ghost from a queued message, so:
 *
 * - `messages.reserved_by`: the milter process (its incarnation, a random uuid per start) that reserved
 *   the row; NULL for rows made otherwise (a delivery without reservation, older milters).
 * - `milter_incarnations`: each live milter's heartbeat (PostgreSQL's clock), the keys of the
 *   reservations whose answer it has not yet handed to Postfix (`open_inbox_ids`, `open_message_ids`),
 *   and `answered_before` (its own clock, the one `reserved_at` is written with): a reservation it makes
 *   from then on may not be named yet (core/reservation-ledger.ts). A milter whose heartbeat is older
 *   than the lease is dead; its in-flight rows that are named, or reserved from `answered_before` on,
 *   may be ghosts and are deleted, as a withdrawal deletes them: had Postfix queued the message after
 *   all, its delivery is still stored (begin_delivery makes the row again), only its quota was not held
 *   meanwhile. That is at most what the milter answered in its last heartbeat interval.
 * - `reserve_messages` with a seventh argument, the owner, and `reserve_message_batch` with an array
 *   of owners. The six-argument forms stay for milters started before this migration (expand-only);
 *   `reserve_messages`' now calls the new one.
 *
 * No new index: the sweep reads in-flight rows from `answered_before` on through messages_in_flight,
 * and the named ones by their key.
 */
import type { Knex } from 'knex';

export const RESERVE_BODY = (owner: string) => `
    DECLARE
      v_quota int8;
      v_held int8;
      v_outcomes text[] := '{}';
    BEGIN
      FOR i IN 1 .. coalesce(cardinality(p_inbox_ids), 0) LOOP
        SELECT quota_bytes, held_bytes INTO v_quota, v_held FROM inboxes
          WHERE inbox_id = p_inbox_ids[i] FOR UPDATE;
        IF NOT FOUND THEN
          RAISE EXCEPTION 'no inbox %', p_inbox_ids[i];
        END IF;
        v_outcomes := v_outcomes || CASE
          WHEN EXISTS (SELECT 1 FROM messages WHERE queue_id = p_queue_id AND inbox_id = p_inbox_ids[i])
            THEN 'exists'
          WHEN inbox_used_bytes(p_inbox_ids[i], v_held, p_now) + p_sizes[i] > v_quota THEN 'over_quota'
          ELSE 'reserved' END;
      END LOOP;
      IF 'over_quota' = ANY (v_outcomes) THEN
        RETURN v_outcomes;
      END IF;
      FOR i IN 1 .. coalesce(cardinality(p_inbox_ids), 0) LOOP
        IF v_outcomes[i] = 'reserved' THEN
          -- The insert's trigger adds the size to held_bytes and moves the inbox's version.
          INSERT INTO messages (inbox_id, message_id, queue_id, state, size_bytes, envelope_from, reserved_at${owner ? ', reserved_by' : ''})
            VALUES (p_inbox_ids[i], p_message_ids[i], p_queue_id, 'in_flight', p_sizes[i], p_envelope_from, p_now${owner ? `, ${owner}` : ''});
        END IF;
      END LOOP;
      RETURN v_outcomes;
    END`;

export async function up(knex: Knex): Promise<void> {
  await knex.raw(`
    ALTER TABLE messages ADD COLUMN reserved_by uuid;

    CREATE TABLE milter_incarnations (
      incarnation_id uuid PRIMARY KEY,
      started_at timestamptz NOT NULL DEFAULT now(),
      heartbeat_at timestamptz NOT NULL,
      answered_before timestamptz NOT NULL,
      open_inbox_ids text[] NOT NULL DEFAULT '{}',
      open_message_ids text[] NOT NULL DEFAULT '{}'
    );

    CREATE FUNCTION reserve_messages(
      p_inbox_ids text[], p_message_ids text[], p_queue_id text, p_sizes int8[], p_envelope_from text,
      p_now timestamptz, p_reserved_by uuid
    ) RETURNS text[] LANGUAGE plpgsql VOLATILE AS $fn$${RESERVE_BODY('p_reserved_by')}
    $fn$;

    CREATE OR REPLACE FUNCTION reserve_messages(
      p_inbox_ids text[], p_message_ids text[], p_queue_id text, p_sizes int8[], p_envelope_from text,
      p_now timestamptz
    ) RETURNS text[] LANGUAGE sql VOLATILE AS $fn$
      SELECT reserve_messages(p_inbox_ids, p_message_ids, p_queue_id, p_sizes, p_envelope_from, p_now,
        NULL::uuid)
    $fn$;

    CREATE FUNCTION reserve_message_batch(
      p_inbox_id text, p_message_ids text[], p_queue_ids text[], p_sizes int8[], p_envelope_froms text[],
      p_nows timestamptz[], p_reserved_bys uuid[]
    ) RETURNS TABLE (n integer, outcome text) LANGUAGE plpgsql VOLATILE AS $fn$
    BEGIN
      FOR i IN 1 .. coalesce(cardinality(p_queue_ids), 0) LOOP
        n := i;
        outcome := (reserve_messages(ARRAY[p_inbox_id], ARRAY[p_message_ids[i]], p_queue_ids[i],
          ARRAY[p_sizes[i]], p_envelope_froms[i], p_nows[i], p_reserved_bys[i]))[1];
        RETURN NEXT;
      END LOOP;
    END
    $fn$;
  `);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw(`
    DROP FUNCTION reserve_message_batch(text, text[], text[], int8[], text[], timestamptz[], uuid[]);
    CREATE OR REPLACE FUNCTION reserve_messages(
      p_inbox_ids text[], p_message_ids text[], p_queue_id text, p_sizes int8[], p_envelope_from text,
      p_now timestamptz
    ) RETURNS text[] LANGUAGE plpgsql VOLATILE AS $fn$${RESERVE_BODY('')}
    $fn$;
    DROP FUNCTION reserve_messages(text[], text[], text, int8[], text, timestamptz, uuid);
    DROP TABLE milter_incarnations;
    ALTER TABLE messages DROP COLUMN reserved_by;
  `);
}
