/**
 * reserve_messages locks the inbox row FOR NO KEY UPDATE instead of FOR UPDATE.
 *
 * Why: a delivery that makes its own message row (begin_delivery without a reservation: a row the
 * orphan sweep took, a delivery without a queue id, mail that did not pass our milter) holds KEY SHARE
 * on its inbox row through the foreign key until it commits, which for a streamed message lasts while
 * its bytes arrive. KEY SHARE conflicts with FOR UPDATE only, so every reservation for that inbox
 * waited for the whole store and, past lock_timeout (20 s), failed: a 4xx for each message meanwhile.
 * FOR NO KEY UPDATE still orders reservations among themselves, after the stores' and jobs' updates of
 * the inbox row (NO KEY UPDATE) and the expiry pick's FOR SHARE; nothing here changes a key.
 *
 * The body is 20261207000000's with the lock mode changed; the six-argument form calls this one.
 */
import type { Knex } from 'knex';
import { RESERVE_BODY } from './20261207000000_reservation_owner.ts';

const SIGNATURE = `reserve_messages(
      p_inbox_ids text[], p_message_ids text[], p_queue_id text, p_sizes int8[], p_envelope_from text,
      p_now timestamptz, p_reserved_by uuid
    )`;

function body(lock: 'FOR UPDATE' | 'FOR NO KEY UPDATE'): string {
  const original = RESERVE_BODY('p_reserved_by');
  const changed = original.replace(
    'WHERE inbox_id = p_inbox_ids[i] FOR UPDATE;',
    `WHERE inbox_id = p_inbox_ids[i] ${lock};`,
  );
  if (lock !== 'FOR UPDATE' && changed === original)
    throw new Error('reserve_messages: lock clause not found');
  return changed;
}

export async function up(knex: Knex): Promise<void> {
  await knex.raw(`
    CREATE OR REPLACE FUNCTION ${SIGNATURE} RETURNS text[] LANGUAGE plpgsql VOLATILE AS $fn$${body('FOR NO KEY UPDATE')}
    $fn$;
  `);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw(`
    CREATE OR REPLACE FUNCTION ${SIGNATURE} RETURNS text[] LANGUAGE plpgsql VOLATILE AS $fn$${body('FOR UPDATE')}
    $fn$;
  `);
}
