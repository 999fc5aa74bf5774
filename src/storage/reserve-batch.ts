/**
 * reserve-batch - the milter's reservation of a message in a single inbox through an InboxBatcher:
 * alone, reserve_messages; several for one inbox, one reserve_message_batch call
 * (migrations/20261127000000_inbox_batches.ts), which makes each exactly as reserve_messages does, in
 * the order given, each one's quota check counting the ones before it. A message for several inboxes
 * is reserved in all of them or none by one reserve_messages call of its own (message-store.ts). Each
 * row names the milter process that reserved it (Reservation.reservedBy; mail/orphan-sweep.ts).
 */
import type { Reservation } from '../core/ports.ts';
import type { Database } from './database.ts';
import { InboxBatcher, inOrder } from './inbox-batcher.ts';

export type ReserveOutcome = 'reserved' | 'exists' | 'over_quota';

/** The same statement as a reservation in several inboxes (message-store.ts), with arrays of one. */
export const RESERVE_SQL = 'SELECT reserve_messages($1, $2, $3, $4, $5, $6, $7) AS outcomes';
const BATCH_SQL = 'SELECT n, outcome FROM reserve_message_batch($1, $2, $3, $4, $5, $6, $7)';

export function singleInboxReservations(db: Database): InboxBatcher<Reservation, ReserveOutcome> {
  return new InboxBatcher<Reservation, ReserveOutcome>({
    async single(r) {
      const [row] = await db.rows<{ outcomes: ReserveOutcome[] }>('reserve-messages', RESERVE_SQL, [
        [r.inboxId],
        [r.messageId],
        r.queueId,
        [r.sizeBytes],
        r.envelopeFrom,
        r.now,
        r.reservedBy ?? null,
      ]);
      const [outcome] = row?.outcomes ?? [];
      if (!outcome) throw new Error('reserve_messages returned no outcome');
      return outcome;
    },
    async batch(reservations) {
      const column = <T>(pick: (r: Reservation) => T) => reservations.map(pick);
      const rows = await db.rows<{ n: number; outcome: ReserveOutcome }>('reserve-batch', BATCH_SQL, [
        reservations[0]?.inboxId,
        column((r) => r.messageId),
        column((r) => r.queueId),
        column((r) => r.sizeBytes),
        column((r) => r.envelopeFrom),
        column((r) => r.now.toISOString()),
        column((r) => r.reservedBy ?? null),
      ]);
      return inOrder(rows, reservations.length).map((row) => row.outcome);
    },
  });
}
