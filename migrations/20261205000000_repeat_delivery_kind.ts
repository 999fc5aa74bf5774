/**
 * repeat_delivery_kind: what a delivery the store functions answered 'duplicate' (its queue id
 * already has a row in the inbox) came to. A row deleted without ever being stored (no event position)
 * by the cancel, the expiry sweep or the reservation release kept nothing of this delivery either
 * ('cancelled', 'expired', 'released'); any other is a redelivery of what was stored ('duplicate',
 * "already stored").
 *
 * Why: such deliveries answered "already stored" (the commonest: a message reserved before its inbox
 * was cancelled, delivered after). A row that was stored and later deleted (a lost 250 reply, then
 * the cancel or the expiry) stays 'duplicate': it was stored. The receiver asks only for deliveries
 * answered 'duplicate' (storage/message-store.ts), which are rare, so the store functions of
 * migration 20261203000000 stay as they are.
 */
import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  await knex.raw(`
    CREATE FUNCTION repeat_delivery_kind(p_inbox_id text, p_message_id text)
    RETURNS text LANGUAGE sql STABLE AS $fn$
      SELECT CASE WHEN m.state = 'deleted' AND m.position IS NULL
                       AND m.deleted_reason IN ('cancelled', 'expired', 'released')
                  THEN m.deleted_reason ELSE 'duplicate' END
        FROM messages m WHERE m.inbox_id = p_inbox_id AND m.message_id = p_message_id
    $fn$;
  `);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('DROP FUNCTION repeat_delivery_kind(text, text)');
}
