/**
 * extend_idempotency.response_text: an extend's response as it was sent, so that its replay is the
 * same bytes (contract 5.7: "returns the original response"). The jsonb `response` column reorders an
 * object's keys (shortest first), so a replay came back with the same values in another order. The
 * receiver writes both columns and reads the text when there is one; the jsonb column stays for API
 * processes started before this migration (expand, not change; STYLE) and can go once none runs.
 */
import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  await knex.raw('ALTER TABLE extend_idempotency ADD COLUMN response_text text');
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('ALTER TABLE extend_idempotency DROP COLUMN response_text');
}
