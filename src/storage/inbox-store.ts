/**
 * inbox-store - Postgres implementation of the core's InboxStore port.
 */
import type { InboxRecord, Usage } from '../core/model.ts';
import type { DeliveryTarget, InboxStore, NewInbox, ProvisionClaim, StoredProvision } from '../core/ports.ts';
import type { Database, Queryable } from './database.ts';
import { INBOX_COLUMNS, type InboxRow, OPTED_OUT_AMONG, toInbox, UNDELETED_OF } from './rows.ts';
import { USAGE_WHERE } from './usage.ts';

/** A cancelled inbox's message as deleted ($2 the cancel's time), unless deleted already. */
const CANCELLED = `state = 'deleted', deleted_at = coalesce(deleted_at, $2),
           deleted_reason = coalesce(deleted_reason, 'cancelled')`;

const USAGE_SQL = `
  SELECT count(*)::int AS message_count, coalesce(sum(size_bytes), 0)::int8 AS quota_used_bytes
  FROM messages WHERE ${USAGE_WHERE('$1', '$2::timestamptz')}`;

export class PgInboxStore implements InboxStore {
  readonly #db: Database;

  constructor(db: Database) {
    this.#db = db;
  }

  async create(
    inbox: NewInbox,
    claim?: ProvisionClaim,
  ): Promise<{ created: true } | { created: false; existing: StoredProvision }> {
    const outcome = await this.#db.transaction(async (client) => {
      if (claim) {
        // A live record for the key wins; an expired one is replaced (the key is forgotten after the TTL).
        const claimed = await client.query(
          `INSERT INTO provision_idempotency AS p (key_hash, request_hash, sealed_response, created_at)
           VALUES ($1, $2, $3, $4)
           ON CONFLICT (key_hash) DO UPDATE
             SET request_hash = excluded.request_hash, sealed_response = excluded.sealed_response,
                 created_at = excluded.created_at
             WHERE p.created_at < $5
           RETURNING 1`,
          [claim.keyHash, claim.requestHash, claim.sealedResponse, claim.now, claim.forgetBefore],
        );
        if (claimed.rowCount === 0) return 'taken' as const;
      }
      await client.query(
        `INSERT INTO inboxes (inbox_id, created_at, expires_at, quota_bytes, sender_domains)
         VALUES ($1, $2, $3, $4, $5)`,
        [inbox.inboxId, inbox.createdAt, inbox.expiresAt, inbox.quotaBytes, inbox.senderDomains],
      );
      await client.query(
        `INSERT INTO credentials (credential_hash, inbox_id, role) VALUES ($1, $3, 'owner'), ($2, $3, 'reader')`,
        [inbox.ownerHash, inbox.readerHash, inbox.inboxId],
      );
      return 'created' as const;
    });
    if (outcome === 'created') return { created: true };
    const claim_ = claim as ProvisionClaim;
    const [existing] = await this.#db.rows<{ request_hash: Buffer; sealed_response: Buffer }>(
      'provision-replay',
      'SELECT request_hash, sealed_response FROM provision_idempotency WHERE key_hash = $1',
      [claim_.keyHash],
    );
    if (!existing) throw new Error('idempotency record vanished between claim and read');
    return {
      created: false,
      existing: { requestHash: existing.request_hash, sealedResponse: existing.sealed_response },
    };
  }

  async findProvision(keyHash: Buffer, forgetBefore: Date): Promise<StoredProvision | undefined> {
    const [row] = await this.#db.rows<{ request_hash: Buffer; sealed_response: Buffer }>(
      'provision-find',
      'SELECT request_hash, sealed_response FROM provision_idempotency WHERE key_hash = $1 AND created_at >= $2',
      [keyHash, forgetBefore],
    );
    return row ? { requestHash: row.request_hash, sealedResponse: row.sealed_response } : undefined;
  }

  async usage(inboxId: string, asOf: Date, on?: Queryable): Promise<Usage> {
    const [row] = await this.#db.rows<{ message_count: number; quota_used_bytes: number }>(
      'inbox-usage',
      USAGE_SQL,
      [inboxId, asOf],
      on,
    );
    return { messageCount: row?.message_count ?? 0, quotaUsedBytes: row?.quota_used_bytes ?? 0 };
  }

  async extend(
    inboxId: string,
    seconds: number,
    clock: () => Date,
    key: Buffer | undefined,
    respond: (inbox: InboxRecord, usage: Usage, now: Date) => unknown,
  ): Promise<
    | { kind: 'extended' | 'replayed'; response: unknown }
    | { kind: 'expired' }
    | { kind: 'cancelled'; cancelledAt: Date }
  > {
    return this.#db.transaction(async (client) => {
      // The row lock serializes extends of one inbox, so two requests with one key cannot both apply,
      // and orders an extend after a cancel holding the row: the cancel, once committed, wins. NO KEY:
      // a store that made its own message row holds KEY SHARE on the inbox while it streams, and need
      // not hold an extend back (migration 20261208000000).
      const locked = await client.query<{ cancelled_at: Date | null }>(
        'SELECT cancelled_at FROM inboxes WHERE inbox_id = $1 FOR NO KEY UPDATE',
        [inboxId],
      );
      const cancelledAt = locked.rows[0]?.cancelled_at;
      if (cancelledAt) return { kind: 'cancelled' as const, cancelledAt };
      // After the lock: an extend that waited behind the expiry job's batch must see its own time move.
      const now = clock();
      if (key) {
        // The text as sent, when there is one (migration 20261204000000): jsonb reorders the keys.
        const replay = await client.query<{ response_text: string | null; response: unknown }>(
          'SELECT response_text, response FROM extend_idempotency WHERE inbox_id = $1 AND key_hash = $2',
          [inboxId, key],
        );
        const stored = replay.rows[0];
        if (stored) {
          const response: unknown =
            stored.response_text === null ? stored.response : JSON.parse(stored.response_text);
          return { kind: 'replayed' as const, response };
        }
      }
      const updated = await client.query<InboxRow>(
        // A new version ends what API processes keep of the inbox (poll pages, usage): a page kept
        // while it looked expired listed no messages, and was served on after the extend.
        `UPDATE inboxes i SET expires_at = expires_at + make_interval(secs => $2), version = version + 1
         WHERE inbox_id = $1 AND expires_at > $3 RETURNING ${INBOX_COLUMNS}`,
        [inboxId, seconds, now],
      );
      const row = updated.rows[0];
      if (!row) return { kind: 'expired' as const };
      const response = respond(toInbox(row), await this.usage(inboxId, now, client), now);
      if (key) {
        // The same text twice: `response` (jsonb) for the code before migration 20261204000000.
        const text = JSON.stringify(response);
        await client.query(
          `INSERT INTO extend_idempotency (inbox_id, key_hash, response, response_text, created_at)
           VALUES ($1, $2, $3, $4, $5)`,
          [inboxId, key, text, text, now],
        );
      }
      return { kind: 'extended' as const, response };
    });
  }

  async setSenderDomains(
    inboxId: string,
    domains: string[],
    now: Date,
  ): Promise<
    { kind: 'updated'; inbox: InboxRecord } | { kind: 'expired' } | { kind: 'cancelled'; cancelledAt: Date }
  > {
    // An update waiting on a cancel's row lock re-checks the row once the cancel commits.
    const [row] = await this.#db.rows<InboxRow>(
      'inbox-set-sender-domains',
      `UPDATE inboxes i SET sender_domains = $2
       WHERE inbox_id = $1 AND expires_at > $3 AND cancelled_at IS NULL RETURNING ${INBOX_COLUMNS}`,
      [inboxId, domains, now],
    );
    if (row) return { kind: 'updated', inbox: toInbox(row) };
    const [missed] = await this.#db.rows<{ cancelled_at: Date | null }>(
      'inbox-cancelled-at',
      'SELECT cancelled_at FROM inboxes WHERE inbox_id = $1',
      [inboxId],
    );
    return missed?.cancelled_at
      ? { kind: 'cancelled', cancelledAt: missed.cancelled_at }
      : { kind: 'expired' };
  }

  async findForDelivery(
    inboxId: string,
    asOf: Date,
    senderDomains: string[] = [],
  ): Promise<DeliveryTarget | undefined> {
    const [row] = await this.#db.rows<InboxRow & { used_bytes: number; opted_out: string[] }>(
      'inbox-for-delivery',
      // The counter and its overdue messages (migrations/20261125000000_held_bytes.ts), not a sum over
      // the inbox's messages: the policy daemon asks on every RCPT.
      `SELECT ${INBOX_COLUMNS}, inbox_used_bytes(i.inbox_id, i.held_bytes, $2) AS used_bytes,
         ${OPTED_OUT_AMONG('$3')} AS opted_out
       FROM inboxes i WHERE i.inbox_id = $1`,
      [inboxId, asOf, senderDomains],
    );
    return row ? { inbox: toInbox(row), usedBytes: row.used_bytes, optedOut: row.opted_out } : undefined;
  }

  async find(inboxId: string): Promise<InboxRecord | undefined> {
    const [row] = await this.#db.rows<InboxRow>(
      'inbox-find',
      `SELECT ${INBOX_COLUMNS} FROM inboxes i WHERE i.inbox_id = $1`,
      [inboxId],
    );
    return row ? toInbox(row) : undefined;
  }

  async findWithOptOuts(
    inboxIds: string[],
    senderDomains: string[],
  ): Promise<{ inboxes: Map<string, InboxRecord>; optedOut: string[] }> {
    // One row per inbox found, each carrying the opt-outs; one row of NULLs when no inbox is.
    const rows = await this.#db.rows<Partial<InboxRow> & { opted_out: string[] }>(
      'inboxes-with-optouts',
      `SELECT o.opted_out, ${INBOX_COLUMNS}
       FROM (SELECT ${OPTED_OUT_AMONG('$2')} AS opted_out) o
       LEFT JOIN inboxes i ON i.inbox_id = ANY($1)`,
      [inboxIds, senderDomains],
    );
    const inboxes = new Map<string, InboxRecord>();
    for (const row of rows) if (row.inbox_id) inboxes.set(row.inbox_id, toInbox(row as InboxRow));
    return { inboxes, optedOut: rows[0]?.opted_out ?? [] };
  }

  async cancel(inboxId: string, now: Date): Promise<InboxRecord | undefined> {
    const cancelled = await this.#cancelOnce(inboxId, now);
    if (cancelled) await this.#deleteStoredLeft(inboxId, now);
    return cancelled;
  }

  /**
   * A message stored after the cancel locked its messages, and held by a download or listing mark
   * while it marked the rest, was skipped (waiting for it would deadlock: the mark waits for the
   * inbox row the cancel holds) and stayed `stored` without its chunks. Once the cancel has
   * committed nothing waits for that row: such messages are deleted now, as the cancel deletes.
   */
  async #deleteStoredLeft(inboxId: string, now: Date): Promise<void> {
    // Tried three times (a deadlock with a listing's marks, a lock timeout); a cancel run again does
    // it again, and the deletion job reports a message left so as lost.
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.#deleteStoredLeftOnce(inboxId, now);
      } catch (error) {
        if (attempt >= 3) throw error;
      }
    }
  }

  async #deleteStoredLeftOnce(inboxId: string, now: Date): Promise<void> {
    await this.#db.transaction(async (client) => {
      const left = await client.query<{ message_id: string }>(
        `UPDATE messages SET ${CANCELLED} WHERE ${UNDELETED_OF('$1')} AND state = 'stored' RETURNING message_id`,
        [inboxId, now],
      );
      if (left.rows.length === 0) return;
      await client.query('DELETE FROM message_chunks WHERE inbox_id = $1 AND message_id = ANY($2)', [
        inboxId,
        left.rows.map((row) => row.message_id),
      ]);
    });
  }

  async #cancelOnce(inboxId: string, now: Date): Promise<InboxRecord | undefined> {
    return this.#db.transaction(async (client) => {
      // The messages' rows before the inbox row, the order a store, the jobs and the API's marks take
      // them in: a store holding its message's row and waiting for the inbox row would otherwise
      // deadlock with this. A store in progress finishes first, and its message is deleted with the rest.
      await client.query(`SELECT 1 FROM messages WHERE ${UNDELETED_OF('$1')} FOR UPDATE`, [inboxId]);
      const updated = await client.query<InboxRow>(
        `UPDATE inboxes i SET cancelled_at = coalesce(cancelled_at, $2), version = version + 1
         WHERE inbox_id = $1 AND (expires_at > $2 OR cancelled_at IS NOT NULL) RETURNING ${INBOX_COLUMNS}`,
        [inboxId, now],
      );
      const row = updated.rows[0];
      if (!row) return undefined;
      // Mail is deleted at once (contract section 3); chunks go, the rows stay as tombstones.
      await client.query(`DELETE FROM message_chunks WHERE inbox_id = $1`, [inboxId]);
      // Every row locked above is ours. A row another transaction holds now was made after that lock
      // (a reservation committed meanwhile, whose store has begun): waiting for it deadlocked, since
      // that store waits for the inbox row this transaction holds. It is skipped: its store finds the
      // inbox cancelled once this commits, and deletes it itself (finish_delivery_outcome); one stored
      // meanwhile and held by a mark goes after the commit (#deleteStoredLeft).
      await client.query(
        `UPDATE messages SET ${CANCELLED}
         WHERE (inbox_id, message_id) IN (
           SELECT inbox_id, message_id FROM messages WHERE ${UNDELETED_OF('$1')}
           FOR UPDATE SKIP LOCKED)`,
        [inboxId, now],
      );
      return toInbox(row);
    });
  }
}
