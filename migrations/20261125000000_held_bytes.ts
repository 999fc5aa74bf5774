/**
 * The mail path reads an inbox's usage without summing its messages.
 *
 * `inboxes.held_bytes` is the sum of size_bytes over the inbox's messages not yet deleted (in flight or
 * stored), kept by statement-level triggers on messages: every INSERT, UPDATE and DELETE, cascades
 * included, adds its net change per inbox, locking the inboxes in key order (two sweeps over the same
 * inboxes cannot deadlock). One definition for every path that changes a message: the delivery
 * functions, the API's marks and cancel, and the jobs.
 *
 * `inbox_used_bytes(inbox, held, now)` is the usage rule (counts_in_usage) at `now`: held_bytes minus
 * the messages whose delete_after has passed but which the delete-messages job has not marked yet,
 * found through messages_overdue. The two agree at the present instant because no message is
 * reserved or deleted in the future; test/storage/held-bytes.test.ts checks them against each other
 * after every kind of change.
 *
 * Why: the policy daemon (SIZE= against free quota) and the milter's reservation summed every message
 * of the recipient inbox on every delivery, O(messages) per message and, for the reservation, under
 * the inbox's row lock. With mail-bench's 2,000 messages to one inbox the sums were half of Postgres's
 * CPU. The API's status keeps counting with counts_in_usage: it needs the count and the usage at
 * expires_at too, and caches both by inbox version.
 */
import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  await knex.raw(`
    -- No message changes while the counter is filled and its triggers created.
    LOCK TABLE messages IN SHARE ROW EXCLUSIVE MODE;

    ALTER TABLE inboxes ADD COLUMN held_bytes int8 NOT NULL DEFAULT 0;
    UPDATE inboxes i SET held_bytes = h.bytes
      FROM (SELECT inbox_id, sum(size_bytes)::int8 AS bytes FROM messages WHERE state <> 'deleted'
            GROUP BY inbox_id) h
      WHERE i.inbox_id = h.inbox_id;

    -- Each statement's net change per inbox, applied in inbox order; usage changed, so the inbox's
    -- version moves too (core/usage-cache.ts): one update of the inbox row, not two.
    CREATE FUNCTION track_held_bytes() RETURNS trigger LANGUAGE plpgsql AS $fn$
    DECLARE
      r record;
    BEGIN
      IF TG_OP = 'INSERT' THEN
        FOR r IN SELECT inbox_id, sum(size_bytes)::int8 AS delta FROM new_rows WHERE state <> 'deleted'
                 GROUP BY inbox_id HAVING sum(size_bytes) <> 0 ORDER BY inbox_id LOOP
          UPDATE inboxes SET held_bytes = held_bytes + r.delta, version = version + 1 WHERE inbox_id = r.inbox_id;
        END LOOP;
      ELSIF TG_OP = 'DELETE' THEN
        FOR r IN SELECT inbox_id, sum(size_bytes)::int8 AS delta FROM old_rows WHERE state <> 'deleted'
                 GROUP BY inbox_id HAVING sum(size_bytes) <> 0 ORDER BY inbox_id LOOP
          UPDATE inboxes SET held_bytes = held_bytes - r.delta, version = version + 1 WHERE inbox_id = r.inbox_id;
        END LOOP;
      ELSE
        FOR r IN SELECT inbox_id, sum(bytes)::int8 AS delta FROM (
                   SELECT inbox_id, size_bytes AS bytes FROM new_rows WHERE state <> 'deleted'
                   UNION ALL
                   SELECT inbox_id, -size_bytes FROM old_rows WHERE state <> 'deleted') changes
                 GROUP BY inbox_id HAVING sum(bytes) <> 0 ORDER BY inbox_id LOOP
          UPDATE inboxes SET held_bytes = held_bytes + r.delta, version = version + 1 WHERE inbox_id = r.inbox_id;
        END LOOP;
      END IF;
      RETURN NULL;
    END
    $fn$;

    CREATE TRIGGER messages_held_insert AFTER INSERT ON messages
      REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION track_held_bytes();
    CREATE TRIGGER messages_held_update AFTER UPDATE ON messages
      REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION track_held_bytes();
    CREATE TRIGGER messages_held_delete AFTER DELETE ON messages
      REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION track_held_bytes();

    -- Held but past delete_after: few per inbox (the delete-messages job marks them within a sweep).
    CREATE INDEX messages_overdue ON messages (inbox_id, delete_after)
      WHERE state <> 'deleted' AND delete_after IS NOT NULL;

    CREATE FUNCTION inbox_used_bytes(p_inbox_id text, p_held_bytes int8, p_now timestamptz)
      RETURNS int8 LANGUAGE plpgsql STABLE AS $fn$
    BEGIN
      RETURN p_held_bytes - coalesce((SELECT sum(size_bytes) FROM messages
        WHERE inbox_id = p_inbox_id AND state <> 'deleted' AND delete_after IS NOT NULL
          AND delete_after <= p_now), 0)::int8;
    END
    $fn$;

    -- As in 20261123000000_delivery_functions.ts, with the usage read from the counter.
    CREATE OR REPLACE FUNCTION reserve_messages(
      p_inbox_ids text[], p_message_ids text[], p_queue_id text, p_sizes int8[], p_envelope_from text,
      p_now timestamptz
    ) RETURNS text[] LANGUAGE plpgsql VOLATILE AS $fn$
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
          INSERT INTO messages (inbox_id, message_id, queue_id, state, size_bytes, envelope_from, reserved_at)
            VALUES (p_inbox_ids[i], p_message_ids[i], p_queue_id, 'in_flight', p_sizes[i], p_envelope_from, p_now);
        END IF;
      END LOOP;
      RETURN v_outcomes;
    END
    $fn$;
  `);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw(`
    CREATE OR REPLACE FUNCTION reserve_messages(
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
          UPDATE inboxes SET version = version + 1 WHERE inbox_id = p_inbox_ids[i];
          INSERT INTO messages (inbox_id, message_id, queue_id, state, size_bytes, envelope_from, reserved_at)
            VALUES (p_inbox_ids[i], p_message_ids[i], p_queue_id, 'in_flight', p_sizes[i], p_envelope_from, p_now);
        END IF;
      END LOOP;
      RETURN v_outcomes;
    END
    $fn$;
    DROP FUNCTION inbox_used_bytes(text, int8, timestamptz);
    DROP INDEX messages_overdue;
    DROP TRIGGER messages_held_insert ON messages;
    DROP TRIGGER messages_held_update ON messages;
    DROP TRIGGER messages_held_delete ON messages;
    DROP FUNCTION track_held_bytes();
    ALTER TABLE inboxes DROP COLUMN held_bytes;
  `);
}
