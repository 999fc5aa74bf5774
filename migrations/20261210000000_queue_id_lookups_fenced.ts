/**
 * The two lookups of a delivery's row by its queue id, reserve_messages' "already reserved here?" and
 * begin_delivery's lock of the row it stores into, can only use the idempotency key's index
 * (messages_queue_id_inbox_id_key): their inbox condition is written `(inbox_id || '') = ...`, which
 * the primary key (inbox_id, message_id) cannot serve. Nothing else changes: reserve_messages is
 * 20261208000000's (FOR NO KEY UPDATE), begin_delivery 20261123000000's.
 *
 * Why: on a table a few pages large (a daemon started on a new database) the primary key's
 * `inbox_id = $1` with queue_id as a filter costs what the unique index costs, and some of the
 * milter's connections kept that generic plan: each reservation then read every message of the
 * inbox, under the inbox's row lock, until the next ANALYZE (none, where autovacuum is off). In
 * mail-bench's fourth round into one inbox the reservation read 5,200 buffers and ours fell from 141
 * to 61 messages/s (auto_explain: `Index Scan using messages_pkey ... Filter: (queue_id = $3)`, 1,267
 * rows removed). 20261124000000 fixed the opposite case (lookups by message id planning the unique
 * index); test/storage/key-plans.test.ts checks both.
 */
import type { Knex } from 'knex';
import { RESERVE_BODY } from './20261207000000_reservation_owner.ts';

/** A delivery row's key condition that only messages_queue_id_inbox_id_key can serve. */
const BY_QUEUE_ID = (queueId: string, inboxId: string): string =>
  `queue_id = ${queueId} AND (inbox_id || '') = ${inboxId}`;

const RESERVE_SIGNATURE = `reserve_messages(
      p_inbox_ids text[], p_message_ids text[], p_queue_id text, p_sizes int8[], p_envelope_from text,
      p_now timestamptz, p_reserved_by uuid
    )`;

function replaced(text: string, from: string, to: string): string {
  if (!text.includes(from)) throw new Error(`migration 20261210000000: "${from}" not found`);
  return text.replace(from, to);
}

function reserveBody(fenced: boolean): string {
  const body = replaced(
    RESERVE_BODY('p_reserved_by'),
    'WHERE inbox_id = p_inbox_ids[i] FOR UPDATE;',
    'WHERE inbox_id = p_inbox_ids[i] FOR NO KEY UPDATE;',
  );
  return fenced
    ? replaced(
        body,
        'WHERE queue_id = p_queue_id AND inbox_id = p_inbox_ids[i]',
        `WHERE ${BY_QUEUE_ID('p_queue_id', 'p_inbox_ids[i]')}`,
      )
    : body;
}

const beginDelivery = (key: string) => `
    CREATE OR REPLACE FUNCTION begin_delivery(
      p_inbox_id text, p_new_message_id text, p_queue_id text, p_envelope_from text, p_now timestamptz,
      OUT out_message_id text, OUT out_state text
    ) LANGUAGE plpgsql VOLATILE AS $fn$
    BEGIN
      INSERT INTO messages (inbox_id, message_id, queue_id, state, size_bytes, envelope_from, reserved_at)
        VALUES (p_inbox_id, p_new_message_id, p_queue_id, 'in_flight', 0, p_envelope_from, p_now)
        ON CONFLICT (inbox_id, queue_id) DO NOTHING;
      -- Locks this delivery's row: a concurrent redelivery of the same queue id waits, then sees 'stored'.
      SELECT m.message_id, m.state INTO out_message_id, out_state FROM messages m
        WHERE ${key} FOR UPDATE;
      IF NOT FOUND THEN
        RAISE EXCEPTION 'delivery row missing after insert';
      END IF;
    END
    $fn$;`;

export async function up(knex: Knex): Promise<void> {
  await knex.raw(`
    CREATE OR REPLACE FUNCTION ${RESERVE_SIGNATURE} RETURNS text[] LANGUAGE plpgsql VOLATILE AS $fn$${reserveBody(true)}
    $fn$;
    ${beginDelivery(BY_QUEUE_ID('p_queue_id', 'p_inbox_id'))}
  `);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw(`
    CREATE OR REPLACE FUNCTION ${RESERVE_SIGNATURE} RETURNS text[] LANGUAGE plpgsql VOLATILE AS $fn$${reserveBody(false)}
    $fn$;
    ${beginDelivery('m.inbox_id = p_inbox_id AND m.queue_id = p_queue_id')}
  `);
}
