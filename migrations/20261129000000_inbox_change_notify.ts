/**
 * Changes to what the policy daemon reads at RCPT are announced on the `inbox_changes` channel.
 *
 * Why: the policy daemon asked PostgreSQL about the recipient's inbox on every RCPT, and that round
 * trip (the daemon's and its backend's wake-ups on a busy machine) was a tenth of the mail path's CPU in
 * mail-bench. It now keeps what it read (storage/recipient-lookup.ts) and drops an entry when told it
 * changed; with no listener connected it keeps nothing.
 *
 * What is announced, after commit (NOTIFY is transactional; a rolled-back change says nothing):
 * - the inbox id, when a row's expires_at, cancelled_at, sender_domains or quota_bytes changes, or the
 *   row is deleted (the purge). Not held_bytes, event_seq, version or rejection_count: they change
 *   with every message, and the cache does not hold them (usage is always read fresh).
 * - `*`, on any change to sender_optouts, and on TRUNCATE of either table: everything is dropped.
 * A new inbox needs no announcement: an inbox that was not found is never kept.
 */
import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  await knex.raw(`
    CREATE FUNCTION announce_inbox_change() RETURNS trigger LANGUAGE plpgsql AS $fn$
    BEGIN
      PERFORM pg_notify('inbox_changes', CASE WHEN TG_OP = 'DELETE' THEN OLD.inbox_id ELSE NEW.inbox_id END);
      RETURN NULL;
    END
    $fn$;

    CREATE FUNCTION announce_all_changed() RETURNS trigger LANGUAGE plpgsql AS $fn$
    BEGIN
      PERFORM pg_notify('inbox_changes', '*');
      RETURN NULL;
    END
    $fn$;

    CREATE TRIGGER inboxes_settings_changed
      AFTER UPDATE OF expires_at, cancelled_at, sender_domains, quota_bytes ON inboxes
      FOR EACH ROW
      WHEN (OLD.expires_at IS DISTINCT FROM NEW.expires_at
         OR OLD.cancelled_at IS DISTINCT FROM NEW.cancelled_at
         OR OLD.sender_domains IS DISTINCT FROM NEW.sender_domains
         OR OLD.quota_bytes IS DISTINCT FROM NEW.quota_bytes)
      EXECUTE FUNCTION announce_inbox_change();
    CREATE TRIGGER inboxes_deleted AFTER DELETE ON inboxes
      FOR EACH ROW EXECUTE FUNCTION announce_inbox_change();
    CREATE TRIGGER inboxes_truncated AFTER TRUNCATE ON inboxes
      FOR EACH STATEMENT EXECUTE FUNCTION announce_all_changed();
    CREATE TRIGGER sender_optouts_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON sender_optouts
      FOR EACH STATEMENT EXECUTE FUNCTION announce_all_changed();
  `);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw(`
    DROP TRIGGER sender_optouts_changed ON sender_optouts;
    DROP TRIGGER inboxes_truncated ON inboxes;
    DROP TRIGGER inboxes_deleted ON inboxes;
    DROP TRIGGER inboxes_settings_changed ON inboxes;
    DROP FUNCTION announce_all_changed();
    DROP FUNCTION announce_inbox_change();
  `);
}
