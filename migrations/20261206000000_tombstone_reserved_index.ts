/**
 * drop-tombstones keeps a deleted message's row until RESERVATION_TTL_SECONDS after its reservation
 * (the row is what makes a redelivery of a stored message a duplicate; src/jobs/drop-tombstones.ts), so
 * its pick asks for `reserved_at` as well as `deleted_at`. Nearly every tombstone is past its 410 window
 * long before its reservation's horizon, so messages_deleted_at narrowed nothing and each batch read the
 * whole table (a review: 2.9 M tombstones, 300 ms per batch, every minute). This index finds the rows
 * whose horizon has passed. Expand-only: the old index stays for the readers that use it.
 * test/jobs/indexes.test.ts checks the plan of the job's own statement.
 */
import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  await knex.raw(`
    CREATE INDEX messages_tombstone_horizon ON messages (reserved_at)
      WHERE state = 'deleted' AND deleted_reason <> 'released';
  `);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('DROP INDEX messages_tombstone_horizon');
}
