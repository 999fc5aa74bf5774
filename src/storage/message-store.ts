/**
 * message-store - Postgres implementation of the core's MessageStore port: reservations, streamed
 * storage in fixed-size chunks, the event listing, download marks, byte ranges and rejections.
 */
import { to as copyTo } from 'pg-copy-streams';
import { newMessageId } from '../core/ids.ts';
import type { InboxEvent, MessageRecord, RejectionReason } from '../core/model.ts';
import type {
  Delivery,
  ListWindow,
  MessageKey,
  MessageStore,
  RejectionInput,
  Reservation,
  StoreOutcome,
} from '../core/ports.ts';
import { parseBinaryCopy } from './copy-binary.ts';
import { copyChunks } from './copy-chunks.ts';
import type { Database } from './database.ts';
import type { InboxBatcher } from './inbox-batcher.ts';
import { RESERVE_SQL, type ReserveOutcome, singleInboxReservations } from './reserve-batch.ts';
import { MESSAGE_COLUMNS, type MessageRow, toMessage } from './rows.ts';
import { type WholeMessage, wholeMessageStores } from './store-batch.ts';

/** Bytes per stored chunk: bounds memory per delivery and per download (DESIGN decision 7). */
export const CHUNK_BYTES = 256 * 1024;
/** Chunks fetched per query while streaming a download (about 1 MiB). */
const CHUNKS_PER_READ = 4;
const SAFE_ID = /^[0-9a-z_]{1,40}$/;

/**
 * The listing, one snapshot: messages and rejections after a position (each at most $3). Only the
 * columns a poll presents are read.
 */
export const LIST_EVENTS_SQL = `
  (SELECT 'message' AS kind, m.position, m.size_bytes, m.envelope_from, m.listed_at, m.message_id, m.from_name,
          m.from_address, m.subject, m.internet_message_id, m.authentication, m.received_at, m.downloaded_at,
          m.delete_after, NULL::timestamptz AS at, NULL::text AS reason, NULL::text AS sender_domain
   FROM messages m
   WHERE m.inbox_id = $1 AND m.position > $2 AND m.state = 'stored' AND $5::boolean
     AND (m.delete_after IS NULL OR m.delete_after > $4)
   ORDER BY m.position LIMIT $3)
  UNION ALL
  (SELECT 'rejection', r.position, r.size_bytes, r.envelope_from, r.listed_at, NULL, NULL, NULL, NULL, NULL, NULL,
          NULL, NULL, NULL, r.at, r.reason, r.sender_domain
   FROM rejections r
   WHERE r.inbox_id = $1 AND r.position > $2 AND (r.listed_at IS NULL OR r.listed_at > $6)
   ORDER BY r.position LIMIT $3)`;

/** A listed event: a message's listing columns (as MessageRow types them) or a rejection's. */
type EventRow = Pick<
  MessageRow,
  | 'size_bytes'
  | 'envelope_from'
  | 'listed_at'
  | 'message_id'
  | 'from_name'
  | 'from_address'
  | 'subject'
  | 'internet_message_id'
  | 'authentication'
  | 'received_at'
  | 'downloaded_at'
  | 'delete_after'
> & {
  kind: 'message' | 'rejection';
  position: number;
  at: Date;
  reason: RejectionReason;
  sender_domain: string | null;
};

export class PgMessageStore implements MessageStore {
  readonly #db: Database;
  readonly #wholeStores: InboxBatcher<WholeMessage, StoreOutcome>;
  readonly #singleReservations: InboxBatcher<Reservation, ReserveOutcome>;

  constructor(db: Database) {
    this.#db = db;
    this.#wholeStores = wholeMessageStores(db);
    this.#singleReservations = singleInboxReservations(db);
  }

  async reserve(r: Reservation): Promise<'reserved' | 'exists' | 'over_quota'> {
    const [outcome] = await this.#reserve([r]);
    return outcome ?? 'over_quota';
  }

  async withdrawReservations(keys: readonly MessageKey[]): Promise<number> {
    // The held-bytes trigger frees the quota and moves each inbox's version, locking in key order. A
    // delivery storing the message holds its row; once it commits, the row is no longer in flight.
    const rows = await this.#db.rows<{ inbox_id: string }>(
      'withdraw-reservations',
      `DELETE FROM messages m USING unnest($1::text[], $2::text[]) AS k (inbox_id, message_id)
       WHERE m.inbox_id = k.inbox_id AND m.message_id = k.message_id AND m.state = 'in_flight'
       RETURNING m.inbox_id`,
      [keys.map((k) => k.inboxId), keys.map((k) => k.messageId)],
    );
    return rows.length;
  }

  async reserveAll(
    reservations: Reservation[],
  ): Promise<{ kind: 'reserved' } | { kind: 'over_quota'; inboxIds: string[] }> {
    const ordered = [...reservations].sort((a, b) =>
      a.inboxId < b.inboxId ? -1 : a.inboxId > b.inboxId ? 1 : 0,
    );
    const outcomes = await this.#reserve(ordered);
    const full = ordered.filter((_, i) => outcomes[i] === 'over_quota').map((r) => r.inboxId);
    return full.length > 0 ? { kind: 'over_quota', inboxIds: full } : { kind: 'reserved' };
  }

  /**
   * A reservation in one inbox goes through reserve-batch.ts (several for one inbox share a call). For
   * several inboxes, one round trip: reserve_messages (migrations/20261123000000_delivery_functions.ts)
   * locks the inboxes in the order given, so that two multi-inbox reservations cannot deadlock, checks
   * each, and reserves in all of them or in none (DESIGN decision 4).
   */
  async #reserve(ordered: Reservation[]): Promise<('reserved' | 'exists' | 'over_quota')[]> {
    const [first] = ordered;
    if (!first) return [];
    if (ordered.some((r) => r.queueId !== first.queueId || r.envelopeFrom !== first.envelopeFrom))
      throw new Error('the reservations of one delivery share its queue id and envelope sender');
    if (ordered.length === 1) return [await this.#singleReservations.run(first.inboxId, first)];
    const [row] = await this.#db.rows<{ outcomes: ('reserved' | 'exists' | 'over_quota')[] }>(
      'reserve-messages',
      RESERVE_SQL,
      [
        ordered.map((r) => r.inboxId),
        ordered.map((r) => r.messageId),
        first.queueId,
        ordered.map((r) => r.sizeBytes),
        first.envelopeFrom,
        first.now,
        first.reservedBy ?? null,
      ],
    );
    return row?.outcomes ?? [];
  }

  /**
   * A message that fits in one chunk (most mail) is stored with one call once its bytes have arrived, so
   * no connection waits on the sender; several for one inbox share a call (store-batch.ts). A larger one
   * streams chunk by chunk inside a transaction. Either way the message becomes visible, with its event
   * position, in the step that stores its last byte (DESIGN decision 8).
   */
  async store(d: Delivery, body: AsyncIterable<Buffer>): Promise<StoreOutcome> {
    const outcome = await this.#storeOnce(d, body);
    if (outcome.kind !== 'duplicate') return outcome;
    // Its row was there already: a redelivery, or a row deleted without ever being stored (migration
    // 20261205000000). Rare, so asked only then, here, for both paths.
    const [repeat] = await this.#db.rows<{ kind: StoreOutcome['kind'] | null }>(
      'delivery-repeat',
      'SELECT repeat_delivery_kind($1, $2) AS kind',
      [d.inboxId, outcome.messageId],
    );
    return { kind: repeat?.kind ?? 'duplicate', messageId: outcome.messageId };
  }

  async #storeOnce(d: Delivery, body: AsyncIterable<Buffer>): Promise<StoreOutcome> {
    const pieces = body[Symbol.asyncIterator]();
    const head: Buffer[] = [];
    let filled = 0;
    while (filled <= CHUNK_BYTES) {
      const next = await pieces.next();
      if (next.done) return this.#storeWhole(d, Buffer.concat(head, filled));
      head.push(next.value);
      filled += next.value.length;
    }
    return this.#storeStreaming(d, prepended(head, pieces));
  }

  #storeWhole(d: Delivery, data: Buffer): Promise<StoreOutcome> {
    const [fromName, fromAddress, subject, internetMessageId, authentication] = summaryValues(d);
    return this.#wholeStores.run(d.inboxId, {
      inboxId: d.inboxId,
      newMessageId: newMessageId(),
      queueId: d.queueId,
      envelopeFrom: d.envelopeFrom,
      now: d.now.toISOString(),
      data,
      chunkBytes: CHUNK_BYTES,
      fromName,
      fromAddress,
      subject,
      internetMessageId,
      authentication,
    });
  }

  async #storeStreaming(d: Delivery, body: AsyncIterable<Buffer>): Promise<StoreOutcome> {
    const db = this.#db;
    return db.transaction(async (client) => {
      const [row] = await db.rows<{ out_message_id: string; out_state: string }>(
        'delivery-begin',
        'SELECT out_message_id, out_state FROM begin_delivery($1, $2, $3, $4, $5)',
        [d.inboxId, newMessageId(), d.queueId, d.envelopeFrom, d.now],
        client,
      );
      if (!row) throw new Error('begin_delivery returned no row');
      if (row.out_state !== 'in_flight') {
        for await (const _ of body) {
          // drain: the caller's stream must be consumed even when nothing is stored
        }
        return { kind: 'duplicate' as const, messageId: row.out_message_id };
      }
      // NULL for the content digest, no longer computed (store-batch.ts).
      const { size } = await copyChunks(client, d.inboxId, row.out_message_id, body, CHUNK_BYTES);
      const [finished] = await db.rows<{ kind: StoreOutcome['kind'] }>(
        'delivery-finish',
        'SELECT finish_delivery_outcome($1, $2, $3, $4, NULL, $5, $6, $7, $8, $9, $10) AS kind',
        [d.inboxId, row.out_message_id, size, CHUNK_BYTES, ...summaryValues(d), d.now],
        client,
      );
      if (!finished) throw new Error('finish_delivery_outcome returned no row');
      return { kind: finished.kind, messageId: row.out_message_id };
    });
  }

  async find(inboxId: string, messageId: string): Promise<MessageRecord | undefined> {
    // octet_length reads the raw size from each value's header (TOAST pointer or lz4 header), not the data.
    const [row] = await this.#db.rows<MessageRow & { stored_bytes: number }>(
      'message-find',
      `SELECT ${MESSAGE_COLUMNS},
         (SELECT coalesce(sum(octet_length(c.data)), 0)::int8 FROM message_chunks c
          WHERE c.inbox_id = m.inbox_id AND c.message_id = m.message_id) AS stored_bytes
       FROM messages m WHERE m.inbox_id = $1 AND m.message_id = $2`,
      [inboxId, messageId],
    );
    return row ? { ...toMessage(row), storedBytes: row.stored_bytes } : undefined;
  }

  async listEvents(inboxId: string, w: ListWindow): Promise<InboxEvent[]> {
    const rows = await this.#db.rows<EventRow>('events-list', LIST_EVENTS_SQL, [
      inboxId,
      w.afterPosition,
      w.limit + 1,
      w.now,
      w.includeMessages,
      w.rejectionsListedAfter,
    ]);
    const events: InboxEvent[] = rows.map((row) =>
      row.kind === 'message'
        ? { kind: 'message', position: row.position, message: listedMessage(inboxId, row) }
        : {
            kind: 'rejection',
            position: row.position,
            listedAt: row.listed_at,
            rejection: {
              position: row.position,
              at: row.at,
              envelopeFrom: row.envelope_from,
              reason: row.reason,
              senderDomain: row.sender_domain,
              sizeBytes: row.size_bytes,
            },
          },
    );
    return events.sort((a, b) => a.position - b.position);
  }

  async markListed(
    inboxId: string,
    messageIds: string[],
    now: Date,
    deleteAfter: Date,
  ): Promise<Map<string, Date>> {
    const rows = await this.#db.rows<{ message_id: string; delete_after: Date }>(
      'messages-mark-listed',
      bumpingVersion(`UPDATE messages SET listed_at = $3, delete_after = least(coalesce(delete_after, 'infinity'), $4)
         WHERE inbox_id = $1 AND message_id = ANY($2) AND listed_at IS NULL
         RETURNING message_id, delete_after`),
      [inboxId, messageIds, now, deleteAfter],
    );
    return new Map(rows.map((row) => [row.message_id, row.delete_after]));
  }

  async markRejectionsListed(inboxId: string, positions: number[], now: Date): Promise<void> {
    await this.#db.rows(
      'rejections-mark-listed',
      bumpingVersion(`UPDATE rejections SET listed_at = $3
         WHERE inbox_id = $1 AND position = ANY($2) AND listed_at IS NULL RETURNING position`),
      [inboxId, positions, now],
    );
  }

  async markDownloaded(inboxId: string, messageId: string, now: Date, deleteAfter: Date): Promise<void> {
    await this.#db.rows(
      'message-mark-downloaded',
      bumpingVersion(`UPDATE messages SET downloaded_at = coalesce(downloaded_at, $3),
           delete_after = least(coalesce(delete_after, 'infinity'), $4)
         WHERE inbox_id = $1 AND message_id = $2 AND state = 'stored'
           AND (downloaded_at IS NULL OR delete_after IS NULL OR delete_after > $4)
         RETURNING message_id`),
      [inboxId, messageId, now, deleteAfter],
    );
  }

  /** Marks the message deleted (`lost`) and frees what is left of its copy, as delete-messages does. */
  async recordLost(message: MessageRecord, now: Date): Promise<void> {
    await this.#db.rows(
      'message-record-lost',
      bumpingVersion(
        `UPDATE messages SET state = 'deleted', deleted_at = coalesce(deleted_at, $3),
           deleted_reason = coalesce(deleted_reason, 'lost')
         WHERE inbox_id = $1 AND message_id = $2 AND state = 'stored' RETURNING message_id`,
        `DELETE FROM message_chunks WHERE inbox_id = $1 AND message_id = $2 AND EXISTS (SELECT 1 FROM changed)`,
      ),
      [message.inboxId, message.messageId, now],
    );
  }

  async *readRange(message: MessageRecord, start: number, end: number): AsyncIterable<Buffer> {
    const chunkBytes = message.chunkBytes ?? CHUNK_BYTES;
    if (end < start) return;
    const lastSeq = Math.floor(end / chunkBytes);
    for (let seq = Math.floor(start / chunkBytes); seq <= lastSeq; seq += CHUNKS_PER_READ) {
      const upTo = Math.min(lastSeq, seq + CHUNKS_PER_READ - 1);
      const chunks = await this.#readChunks(message, seq, upTo);
      if (chunks.length !== upTo - seq + 1) throw new Error(`message ${message.messageId} is missing chunks`);
      for (let i = 0; i < chunks.length; i++) {
        const data = chunks[i] as Buffer;
        const offset = (seq + i) * chunkBytes;
        yield data.subarray(Math.max(0, start - offset), Math.min(data.length, end - offset + 1));
      }
    }
  }

  /**
   * Chunks first..last of a message, read with binary COPY (see copy-binary.ts) into one buffer; the
   * connection goes back to the pool before the caller writes a byte, so a slow client holds memory
   * (about CHUNKS_PER_READ chunks), never a database connection.
   */
  async #readChunks(message: MessageRecord, first: number, last: number): Promise<Buffer[]> {
    // COPY takes no parameters: every interpolated value is checked to be an id or an integer first.
    if (!SAFE_ID.test(message.inboxId) || !SAFE_ID.test(message.messageId))
      throw new Error('unexpected id format');
    const sql = `COPY (SELECT data FROM message_chunks WHERE inbox_id = '${message.inboxId}'
      AND message_id = '${message.messageId}' AND seq BETWEEN ${Math.trunc(first)} AND ${Math.trunc(last)}
      ORDER BY seq) TO STDOUT (FORMAT binary)`;
    return this.#db.withClient(async (client) => {
      const pieces: Buffer[] = [];
      for await (const piece of client.query(copyTo(sql))) pieces.push(piece as Buffer);
      return parseBinaryCopy(Buffer.concat(pieces));
    });
  }

  async recordRejection(
    input: RejectionInput,
    maxHeld: number,
    heldListedAfter: Date,
  ): Promise<'recorded' | 'counted'> {
    return this.#db.transaction(async (client) => {
      const counted = await client.query(
        'UPDATE inboxes SET rejection_count = rejection_count + 1 WHERE inbox_id = $1',
        [input.inboxId],
      );
      if (!counted.rowCount) return 'counted';
      // A retry is the held event's only when its decision was about the same domain: a first attempt
      // that did not authenticate (a DNS failure, `sender_domain` null) and a retry that authenticated
      // as other.test are two events, or the agent would never learn the domain to add.
      const held = await client.query<{ held: number; same: number }>(
        `SELECT count(*)::int AS held,
                count(*) FILTER (WHERE reason = $3 AND internet_message_id = $4
                                   AND sender_domain IS NOT DISTINCT FROM $5)::int AS same
         FROM rejections WHERE inbox_id = $1 AND (listed_at IS NULL OR listed_at > $2)`,
        [input.inboxId, heldListedAfter, input.reason, input.internetMessageId, input.senderDomain],
      );
      const { held: heldCount = 0, same = 0 } = held.rows[0] ?? {};
      const retry = input.reason === 'sender_not_allowed' && input.internetMessageId !== null && same > 0;
      if (retry || heldCount >= maxHeld) return 'counted';
      const seq = await client.query<{ event_seq: number }>(
        'UPDATE inboxes SET event_seq = event_seq + 1, version = version + 1 WHERE inbox_id = $1 RETURNING event_seq',
        [input.inboxId],
      );
      await client.query(
        `INSERT INTO rejections (inbox_id, position, at, envelope_from, reason, sender_domain, size_bytes, internet_message_id)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
        [
          input.inboxId,
          seq.rows[0]?.event_seq,
          input.now,
          input.envelopeFrom,
          input.reason,
          input.senderDomain,
          input.sizeBytes,
          input.internetMessageId,
        ],
      );
      return 'recorded';
    });
  }
}

/**
 * Wraps an UPDATE ... RETURNING of one inbox's rows ($1 is the inbox id) so that, in the same statement,
 * the inbox's version is bumped when any row changed (core/poll-cache.ts); returns the UPDATE's rows.
 * `alsoWhenChanged`, a further data-modifying statement of the same statement, may test `changed`.
 */
function bumpingVersion(update: string, alsoWhenChanged?: string): string {
  return `WITH changed AS (${update}),
    bumped AS (UPDATE inboxes SET version = version + 1 WHERE inbox_id = $1 AND EXISTS (SELECT 1 FROM changed))
    ${alsoWhenChanged ? `, also AS (${alsoWhenChanged})` : ''}
    SELECT * FROM changed`;
}

/** A listed message: stored, with the fields a poll presents (not its content's size or hash). */
function listedMessage(inboxId: string, row: EventRow): MessageRecord {
  return toMessage({
    ...row,
    inbox_id: inboxId,
    state: 'stored',
    chunk_bytes: null,
    sha256: null,
    deleted_at: null,
    deleted_reason: null,
  });
}

/** A delivery's summary as the delivery functions take it: from name, address, subject, id, authentication. */
/** The summary as the delivery functions take it: the authentication object as JSON text. */
function summaryValues(
  d: Delivery,
): [string | null, string | null, string | null, string | null, string | null] {
  const { fromName, fromAddress, subject, internetMessageId, authentication } = d.summary;
  return [
    fromName,
    fromAddress,
    subject,
    internetMessageId,
    authentication ? JSON.stringify(authentication) : null,
  ];
}

/** The pieces already read, then the rest of the stream. */
async function* prepended(head: Buffer[], rest: AsyncIterator<Buffer>): AsyncIterable<Buffer> {
  try {
    yield* head;
    for (let next = await rest.next(); !next.done; next = await rest.next()) yield next.value;
  } finally {
    await rest.return?.();
  }
}
