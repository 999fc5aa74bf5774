/**
 * store-batch - the receiver's store of a whole message (at most one chunk) through an InboxBatcher:
 * alone, store_whole_message_outcome; several for one inbox, one store_whole_messages_outcome call
 * (migrations 20261127000000 and 20261203000000), which stores each as the single call does, in the
 * order given, idempotently on (inbox, queue id) within the batch too. Each says 'stored', 'duplicate'
 * (message-store.ts then asks what the row it found came to), or 'cancelled' / 'expired' (kept nothing:
 * the inbox had ended).
 */
import type { StoreOutcome } from '../core/ports.ts';
import type { Database } from './database.ts';
import { InboxBatcher, inOrder } from './inbox-batcher.ts';

export interface WholeMessage {
  inboxId: string;
  /** The id the message gets if it is new. */
  newMessageId: string;
  queueId: string;
  envelopeFrom: string;
  /** ISO 8601. */
  now: string;
  data: Buffer;
  chunkBytes: number;
  fromName: string | null;
  fromAddress: string | null;
  subject: string | null;
  internetMessageId: string | null;
  /** JSON text, or null. */
  authentication: string | null;
}

interface OutcomeRow {
  out_kind: StoreOutcome['kind'];
  out_message_id: string;
}

// The NULL is the functions' content digest (p_sha256, p_sha256s), which the mail path no longer
// computes (core/model.ts MessageRecord.sha256); message-store.ts passes it to finish_delivery too.
const SINGLE_SQL =
  'SELECT out_kind, out_message_id FROM store_whole_message_outcome($1, $2, $3, $4, $5, $6, $7, NULL, $8, $9, $10, $11, $12)';
const BATCH_SQL =
  'SELECT n, out_kind, out_message_id FROM store_whole_messages_outcome($1, $2, $3, $4, $5, $6, $7, $8, NULL, $9, $10, $11, $12, $13)';

export function wholeMessageStores(db: Database): InboxBatcher<WholeMessage, StoreOutcome> {
  return new InboxBatcher<WholeMessage, StoreOutcome>({
    bytes: (m) => m.data.length,
    async single(m) {
      const [row] = await db.rows<OutcomeRow>('delivery-store-whole', SINGLE_SQL, [
        m.inboxId,
        m.newMessageId,
        m.queueId,
        m.envelopeFrom,
        m.now,
        m.data,
        m.chunkBytes,
        m.fromName,
        m.fromAddress,
        m.subject,
        m.internetMessageId,
        m.authentication,
      ]);
      if (!row) throw new Error('store_whole_message_outcome returned no row');
      return { kind: row.out_kind, messageId: row.out_message_id };
    },
    async batch(messages) {
      const column = <T>(pick: (m: WholeMessage) => T) => messages.map(pick);
      const rows = await db.rows<OutcomeRow & { n: number }>('delivery-store-batch', BATCH_SQL, [
        messages[0]?.inboxId,
        column((m) => m.newMessageId),
        column((m) => m.queueId),
        column((m) => m.envelopeFrom),
        column((m) => m.now),
        Buffer.concat(column((m) => m.data)),
        column((m) => m.data.length),
        messages[0]?.chunkBytes,
        column((m) => m.fromName),
        column((m) => m.fromAddress),
        column((m) => m.subject),
        column((m) => m.internetMessageId),
        column((m) => m.authentication),
      ]);
      return inOrder(rows, messages.length).map((row) => ({
        kind: row.out_kind,
        messageId: row.out_message_id,
      }));
    },
  });
}
