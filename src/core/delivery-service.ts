/**
 * delivery-service - stores one LMTP delivery (one message, its recipients) and decides one reply per
 * recipient (DESIGN decisions 1, 5, 6, 7). The LMTP adapter translates; this decides.
 *
 * Invariants:
 * - one verdict per recipient, in the order given, duplicates included; only 2xx or 4xx, never a 5xx
 *   (the message is already queued: a bounce now would be backscatter, DESIGN decision 1);
 * - a recipient that is not `<inbox_id>@<mail domain>`, or whose inbox no longer exists, is answered
 *   250 and nothing is stored (logged); a store that fails for any other reason is a 451 4.3.0 for the
 *   recipients of that inbox (logged with the queue id), so Postfix retries;
 * - idempotent per (inbox, queue id): a redelivery of a stored queue id answers 250 and stores nothing;
 * - a delivery into an inbox that has ended (cancelled, or expired more than a minute ago) is answered
 *   250 and kept nowhere (the store removes it), and its reply and log line say so, never `stored`;
 *   Without a queue id (no XFORWARD IDENT) a unique one is made up: that delivery loses idempotency;
 * - streaming: the header block (at most maxHeaderBytes) is read first for the summary and the
 *   authentication verdict, then the bytes go to every recipient inbox at once through a tee that holds
 *   one incoming piece; memory per delivery is the header buffer plus each store's chunk, never the
 *   message size;
 * - the message stream is owned by `deliver` from the call on: it is read to its end before `deliver`
 *   resolves, whatever happened. `deliver` never rejects;
 * - each delivery is logged once (queue id, inbox ids, counts, bytes, time) and reported once to
 *   `observe` (metrics), whose failure is ignored;
 * - at most maxParallelStores inbox stores run at once in this service (each holds a database connection
 *   while its bytes arrive, and a tee waiting for a store that waits for a connection would never move).
 *   Distinct inboxes of one delivery beyond that bound get 452 4.5.3; Postfix sends them again;
 * - a message of at most readAheadBytes (the store's chunk, which it stores whole) is read to its end
 *   before it takes a store slot: a peer that stalls in the middle of one holds no slot (eight such
 *   peers held every slot, and every other delivery of the process waited, until smtp-server's 60 s
 *   socket timeout). A larger message holds its slots while it streams.
 */
import type { Readable } from 'node:stream';
import type { Log } from '../log.ts';
import { readAuthentication } from './authentication-results.ts';
import type { Clock } from './clock.ts';
import { ClockSkewError } from './clock-check.ts';
import { type BodyTee, readAhead, readHead, Slots, teeBody } from './delivery-streams.ts';
import { randomBase32 } from './ids.ts';
import { inboxIdOf } from './mail-address.ts';
import { MAX_HEADER_BYTES, type MessageSummary, summarizeMessage } from './message-summary.ts';
import type { DeliverySummary, MessageStore, StoreOutcome } from './ports.ts';
import { deliveryReplies } from './smtp-replies.ts';
import type { Refusal } from './verdict.ts';

export interface DeliveryEnvelope {
  /** Postfix's queue id (XFORWARD IDENT); null when the client sent none. */
  queueId: string | null;
  /** MAIL FROM, '' for the null sender. */
  envelopeFrom: string;
  /** RCPT TO addresses, in order, one per accepted RCPT (duplicates included). */
  recipients: string[];
}

export interface DeliverySettings {
  mailDomain: string;
  /** The authserv-id of our milter's Authentication-Results field. */
  authservId: string;
  /** Bytes of header block read before storing (default MAX_HEADER_BYTES: any the milter accepts). */
  maxHeaderBytes?: number;
  /** Inbox stores running at once in this service (default 8); keep it below the database pool size. */
  maxParallelStores?: number;
  /** A store that holds the others back this long is given up (451) so they go on (default 60 s). */
  stallMs?: number;
  /** Bytes read before taking store slots (default 256 KiB + 1: storage's CHUNK_BYTES, one more). */
  readAheadBytes?: number;
  /**
   * A store unfinished this long after its body was read is given up (451; default 180 s): above what a
   * healthy store may wait (its inbox's batch lane 30 s, a pool connection 20 s, lock_timeout 20 s,
   * reruns of a failed batch), below Postfix's lmtp_data_done_timeout (600 s).
   */
  storeDeadlineMs?: number;
}

/** An accept carries the text after `250` for the log of the peer (Postfix's `status=sent (...)`). */
export type DeliveryVerdict = { kind: 'accept'; dsn: string; text: string } | Refusal;

/**
 * What one delivery came to (its log line's counts), for metrics. Counts are per distinct inbox, plus
 * one per recipient address that is no inbox.
 */
export interface DeliveryReport {
  queueId: string;
  stored: number;
  duplicate: number;
  /** Not stored and answered 250: no such inbox (any more). */
  discarded: number;
  /** Not kept and answered 250: the inbox was cancelled, or had expired (MessageStore.store). */
  cancelled: number;
  expired: number;
  /** Not kept and answered 250: the release job had given up the message's reservation. */
  released: number;
  /** Deferred (451): the store failed. */
  failed: number;
  /** Deferred (452): more inboxes than stores allowed at once. */
  tooMany: number;
  bytes: number;
  ms: number;
}

type Outcome = StoreOutcome | { kind: 'discarded' | 'failed' | 'too_many' };

/** postfix/main.cf's lmtp_destination_recipient_limit keeps each delivery within it (render test). */
export const DEFAULT_PARALLEL_STORES = 8;
/** Postfix queue ids are alphanumeric (long ids: up to 16 characters); anything printable is taken. */
const QUEUE_ID = /^[\x21-\x7e]{1,64}$/;
export const DEFAULT_STALL_MS = 60_000;
export const DEFAULT_STORE_DEADLINE_MS = 180_000;
/** storage/message-store.ts CHUNK_BYTES and one byte (a test ties them). */
export const DEFAULT_READ_AHEAD_BYTES = 256 * 1024 + 1;

export class DeliveryService {
  readonly #store: MessageStore;
  readonly #clock: Clock;
  readonly #log: Log;
  readonly #mailDomain: string;
  readonly #replies: ReturnType<typeof deliveryReplies>;
  readonly #authservId: string;
  readonly #maxHeaderBytes: number;
  readonly #stallMs: number;
  readonly #readAheadBytes: number;
  readonly #storeDeadlineMs: number;
  readonly #slots: Slots;
  readonly #observe: (report: DeliveryReport) => void;

  constructor(
    store: MessageStore,
    clock: Clock,
    settings: DeliverySettings,
    log: Log,
    observe: (report: DeliveryReport) => void = () => {},
  ) {
    this.#store = store;
    this.#observe = observe;
    this.#clock = clock;
    this.#log = log;
    this.#mailDomain = settings.mailDomain.toLowerCase();
    this.#replies = deliveryReplies(this.#mailDomain);
    this.#authservId = settings.authservId.toLowerCase();
    this.#maxHeaderBytes = settings.maxHeaderBytes ?? MAX_HEADER_BYTES;
    this.#stallMs = settings.stallMs ?? DEFAULT_STALL_MS;
    this.#readAheadBytes = settings.readAheadBytes ?? DEFAULT_READ_AHEAD_BYTES;
    this.#storeDeadlineMs = settings.storeDeadlineMs ?? DEFAULT_STORE_DEADLINE_MS;
    this.#slots = new Slots(Math.max(1, settings.maxParallelStores ?? DEFAULT_PARALLEL_STORES));
  }

  /**
   * Stores `message` in the inbox of every recipient and answers one verdict per recipient, in order.
   * Consumes `message` to its end; never rejects.
   */
  async deliver(
    envelope: DeliveryEnvelope,
    message: AsyncIterable<Buffer> | Readable,
  ): Promise<DeliveryVerdict[]> {
    const started = Date.now();
    const source: AsyncIterator<Buffer> = message[Symbol.asyncIterator]();
    let queueId = envelope.queueId;
    if (!queueId || !QUEUE_ID.test(queueId)) {
      queueId = `local-${randomBase32(20)}`;
      this.#log({
        level: 'warn',
        msg: 'delivery without a usable XFORWARD IDENT: not idempotent',
        queue_id: queueId,
        ident: envelope.queueId?.slice(0, 100) ?? null,
      });
    }
    // The null sender is ''; a NUL (which Postgres text refuses) would otherwise defer forever.
    const envelopeFrom = envelope.envelopeFrom.replaceAll('\0', '');
    const inboxOf = envelope.recipients.map((address) => inboxIdOf(address, this.#mailDomain));
    const targets = [...new Set(inboxOf.filter((id): id is string => id !== null))];
    const storing = targets.slice(0, this.#slots.size);
    const outcomes = new Map<string, Outcome>(
      targets.slice(storing.length).map((id) => [id, { kind: 'too_many' }]),
    );
    let bytes = 0;
    let tee: BodyTee | undefined;
    try {
      const head = await readHead(source, this.#maxHeaderBytes);
      const summary = this.#summarize(head.bytes, envelopeFrom, queueId);
      const ahead = storing.length > 0 ? await readAhead(head, source, this.#readAheadBytes) : head;
      const now = this.#clock.now();
      tee = teeBody(ahead, source, storing.length, this.#stallMs, (i) =>
        this.#log({
          level: 'warn',
          msg: 'store stalled; deferring',
          queue_id: queueId,
          inbox_id: storing[i],
        }),
      );
      const body = tee;
      await this.#slots.acquire(storing.length);
      try {
        await Promise.all(
          storing.map((inboxId, i) =>
            this.#storeWithin(
              { inboxId, queueId, envelopeFrom, summary, now },
              body.branches[i] as AsyncIterable<Buffer>,
            )
              .then(
                (stored): Outcome => stored,
                (error: unknown): Outcome => this.#failure(error, queueId, inboxId),
              )
              .then((outcome) => {
                outcomes.set(inboxId, outcome);
                body.detach(i);
              }),
          ),
        );
      } finally {
        this.#slots.release(storing.length);
      }
    } catch (error) {
      // Reading the message failed (the client went away: nothing was stored; its replies are moot),
      // or this host's clock cannot be trusted (clock-check.ts): deferred, 451.
      const clock = error instanceof ClockSkewError;
      this.#log({
        level: clock ? 'error' : 'warn',
        msg: clock ? 'delivery deferred: clock' : 'reading the message failed',
        queue_id: queueId,
        error: describe(error),
      });
      for (const id of storing) if (!outcomes.has(id)) outcomes.set(id, { kind: 'failed' });
    } finally {
      await tee?.drain();
      bytes = tee?.bytes ?? 0;
    }
    if (!tee) await drainSource(source);

    const verdicts = envelope.recipients.map((address, i) => {
      const inboxId = inboxOf[i] ?? null;
      if (inboxId === null) {
        this.#log({
          level: 'warn',
          msg: 'recipient not stored: not an inbox address',
          queue_id: queueId,
          recipient: address,
        });
        return this.#verdict({ kind: 'discarded' });
      }
      return this.#verdict(outcomes.get(inboxId) ?? { kind: 'failed' });
    });
    const count = (kind: Outcome['kind']) => [...outcomes.values()].filter((o) => o.kind === kind).length;
    const report: DeliveryReport = {
      queueId,
      stored: count('stored'),
      duplicate: count('duplicate'),
      discarded: count('discarded') + inboxOf.filter((id) => id === null).length,
      cancelled: count('cancelled'),
      expired: count('expired'),
      released: count('released'),
      failed: count('failed'),
      tooMany: count('too_many'),
      bytes,
      ms: Date.now() - started,
    };
    this.#log({
      msg: 'delivery',
      queue_id: queueId,
      inbox_ids: targets,
      recipients: envelope.recipients.length,
      stored: report.stored,
      duplicate: report.duplicate,
      discarded: report.discarded,
      cancelled: report.cancelled,
      expired: report.expired,
      released: report.released,
      deferred: report.failed + report.tooMany,
      bytes,
      ms: report.ms,
    });
    try {
      this.#observe(report);
    } catch {
      // metrics must never fail a delivery
    }
    return verdicts;
  }

  /**
   * One inbox's store, given up (451) when it has not finished storeDeadlineMs after its body was all
   * read: a database that stops answering without closing its connections (a hung server, a stalled
   * disk) otherwise left the delivery unanswered and its slot taken for as long as it hung. The store
   * itself may still finish later; Postfix's redelivery is then a duplicate.
   */
  #storeWithin(delivery: Parameters<MessageStore['store']>[0], body: AsyncIterable<Buffer>) {
    let timer: NodeJS.Timeout | undefined;
    let settled = false;
    let start: () => void = () => {};
    const overdue = new Promise<never>((_, reject) => {
      start = () => {
        if (settled) return;
        timer ??= setTimeout(() => reject(new StoreOverdue(this.#storeDeadlineMs)), this.#storeDeadlineMs);
      };
    });
    overdue.catch(() => {});
    const watched: AsyncIterable<Buffer> = {
      [Symbol.asyncIterator]: () => {
        const it = body[Symbol.asyncIterator]();
        return {
          next: async () => {
            const result = await it.next();
            if (result.done) start();
            return result;
          },
          return: async () => (it.return ? it.return() : { value: undefined, done: true }),
        };
      },
    };
    return Promise.race([this.#store.store(delivery, watched), overdue]).finally(() => {
      settled = true;
      clearTimeout(timer);
    });
  }

  /** The summary and authentication verdict; a parser bug degrades to the envelope, never to a 4xx loop. */
  #summarize(head: Buffer, envelopeFrom: string, queueId: string): DeliverySummary {
    let summary: MessageSummary = {
      fromName: null,
      fromAddress: envelopeFrom || null,
      subject: null,
      internetMessageId: null,
    };
    let authentication: DeliverySummary['authentication'] = null;
    try {
      summary = summarizeMessage(head, envelopeFrom, this.#maxHeaderBytes);
      authentication = readAuthentication(head, this.#authservId, envelopeFrom);
    } catch (error) {
      this.#log({ level: 'error', msg: 'header parsing failed', queue_id: queueId, error: describe(error) });
    }
    return { ...summary, authentication };
  }

  #failure(error: unknown, queueId: string, inboxId: string): Outcome {
    // 23503 foreign_key_violation: the inbox row is gone (purged after expiry) - nothing to store into.
    if ((error as { code?: unknown } | null)?.code === '23503') {
      this.#log({
        level: 'warn',
        msg: 'recipient not stored: no such inbox',
        queue_id: queueId,
        inbox_id: inboxId,
      });
      return { kind: 'discarded' };
    }
    this.#log({
      level: 'error',
      msg: 'store failed; deferring',
      queue_id: queueId,
      inbox_id: inboxId,
      error: describe(error),
    });
    return { kind: 'failed' };
  }

  #verdict(outcome: Outcome): DeliveryVerdict {
    switch (outcome.kind) {
      case 'stored':
        return { kind: 'accept', dsn: '2.0.0', text: `${outcome.messageId} stored` };
      case 'duplicate':
        return { kind: 'accept', dsn: '2.0.0', text: `${outcome.messageId} already stored` };
      case 'cancelled':
      case 'expired':
        return { kind: 'accept', dsn: '2.0.0', text: `${outcome.messageId} not kept: inbox ${outcome.kind}` };
      case 'released':
        return { kind: 'accept', dsn: '2.0.0', text: `${outcome.messageId} not kept: reservation released` };
      case 'discarded':
        return { kind: 'accept', dsn: '2.0.0', text: 'not stored: no such inbox' };
      case 'too_many':
        return this.#replies.tooManyRecipients;
      case 'failed':
        return this.#replies.storeFailed;
    }
  }
}

/** A store still unfinished storeDeadlineMs after its body was read (DeliveryService#storeWithin). */
export class StoreOverdue extends Error {
  constructor(ms: number) {
    super(`store did not finish within ${ms} ms of reading its body`);
  }
}

/** Reads an iterator to its end, ignoring its errors (the stream must be consumed whatever happened). */
async function drainSource(source: AsyncIterator<Buffer>): Promise<void> {
  try {
    while (!(await source.next()).done) {
      // discard
    }
  } catch {
    // nothing left to read
  }
}

function describe(error: unknown): string {
  if (error instanceof Error) {
    const code = (error as { code?: unknown }).code;
    return code ? `${error.message} (${String(code)})` : error.message;
  }
  return String(error);
}
