/**
 * download-service - GET and HEAD /v1/inboxes/{id}/messages/{msg_id} (contract section 4).
 *
 * GET, ranged or not, starts the deletion timer before the first byte is sent; HEAD changes nothing.
 * One single byte range is honoured; several ranges, or a Range header that does not parse, are
 * ignored and the whole message is served (RFC 9110 section 14.2 lets a server ignore Range).
 */
import { addSeconds, type Clock } from './clock.ts';
import { ServiceError } from './errors.ts';
import { type LifecycleSettings, messageFate } from './lifecycle.ts';
import type { Caller, MessageRecord } from './model.ts';
import type { MessageStore } from './ports.ts';

export interface DownloadSettings extends LifecycleSettings {
  downloadGraceSeconds: number;
}

export interface Download {
  message: MessageRecord;
  /** Inclusive byte offsets; start > end only for an empty message. */
  start: number;
  end: number;
  partial: boolean;
  etag: string;
  /** Present for GET only; reads the chunks on demand. */
  body: AsyncIterable<Buffer> | undefined;
}

export class DownloadService {
  readonly #messages: MessageStore;
  readonly #clock: Clock;
  readonly #settings: DownloadSettings;
  readonly #log: (line: Record<string, unknown>) => void;

  constructor(
    messages: MessageStore,
    clock: Clock,
    settings: DownloadSettings,
    log: (line: Record<string, unknown>) => void,
  ) {
    this.#messages = messages;
    this.#log = log;
    this.#clock = clock;
    this.#settings = settings;
  }

  async download(
    caller: Caller,
    messageId: string,
    range: string | undefined,
    withBody: boolean,
    /** An `If-Range` validator: the range applies only if it is this message's ETag (RFC 9110 13.1.5). */
    ifRange?: string,
  ): Promise<Download> {
    const now = this.#clock.now();
    const found = await this.#messages.find(caller.inbox.inboxId, messageId);
    const message = availableOrThrow(messageFate(found, caller.inbox, now, this.#settings));
    if (message.storedBytes !== undefined && message.storedBytes !== message.sizeBytes) {
      // Should not happen (contract section 3): say so loudly, then answer as the contract says.
      this.#log({
        level: 'error',
        msg: 'stored copy missing; message deleted as lost',
        inbox_id: message.inboxId,
        message_id: message.messageId,
        size_bytes: message.sizeBytes,
        stored_bytes: message.storedBytes,
      });
      await this.#messages.recordLost(message, now);
      throw new ServiceError('message_gone', 'This message was deleted (lost).', { reason: 'lost' });
    }
    const size = message.sizeBytes;
    // A message's bytes never change, so its id is a strong validator (RFC 9110 8.8.1). Messages
    // stored while the receiver still hashed every byte keep the SHA-256 ETag they were served with.
    const etag = `"${message.sha256 ? message.sha256.toString('base64url') : message.messageId}"`;
    const wanted = ifRange !== undefined && ifRange !== etag ? undefined : parseRange(range, size);
    if (wanted === 'unsatisfiable') {
      throw new ServiceError(
        'range_not_satisfiable',
        `The range is past the end of the ${size}-byte message.`,
        {
          size_bytes: size,
        },
      );
    }
    const [start, end] = wanted ?? [0, size - 1];
    let body: AsyncIterable<Buffer> | undefined;
    if (withBody) {
      await this.#messages.markDownloaded(
        message.inboxId,
        message.messageId,
        now,
        addSeconds(now, this.#settings.downloadGraceSeconds),
      );
      body = await this.#readingFirst(caller, message, start, end);
    }
    return { message, start, end, partial: wanted !== undefined, etag, body };
  }

  /**
   * The body with its first piece already read, before any byte of the answer is sent: a job that
   * deleted the message after it was found (its clock a moment ahead of this request's) makes that
   * read fail, and the answer is the 410 a request a moment later gets. Until 2026-11-25 the client
   * got its connection dropped with no answer. A deletion once bytes are on the way cuts the transfer
   * short (README, "Choices").
   */
  async #readingFirst(
    caller: Caller,
    message: MessageRecord,
    start: number,
    end: number,
  ): Promise<AsyncIterable<Buffer>> {
    const pieces = this.#messages.readRange(message, start, end)[Symbol.asyncIterator]();
    let first: IteratorResult<Buffer>;
    try {
      first = await pieces.next();
    } catch (error) {
      const again = await this.#messages.find(caller.inbox.inboxId, message.messageId);
      const fate = messageFate(again, caller.inbox, this.#clock.now(), this.#settings);
      if (fate.kind !== 'available') availableOrThrow(fate);
      throw error;
    }
    return (async function* () {
      try {
        for (let next = first; !next.done; next = await pieces.next()) yield next.value;
      } finally {
        await pieces.return?.();
      }
    })();
  }
}

/** The message of an available fate; a 404 or a 410 with its reason otherwise. */
function availableOrThrow(fate: ReturnType<typeof messageFate>): MessageRecord {
  if (fate.kind === 'missing') throw messageNotFound();
  if (fate.kind === 'gone') {
    throw new ServiceError('message_gone', `This message was deleted (${fate.reason}).`, {
      reason: fate.reason,
    });
  }
  return fate.message;
}

export const messageNotFound = (): ServiceError =>
  new ServiceError('message_not_found', 'No such message in this inbox.');

/** [start, end] inclusive, undefined to serve the whole message, or 'unsatisfiable'. */
export function parseRange(
  header: string | undefined,
  size: number,
): [number, number] | undefined | 'unsatisfiable' {
  if (header === undefined) return undefined;
  // The range unit is case-insensitive (RFC 9110 section 14.1).
  const match = /^bytes=(\d*)-(\d*)$/i.exec(header.trim());
  if (!match) return undefined;
  const [, first = '', last = ''] = match;
  if (first === '' && last === '') return undefined;
  if (first === '') {
    const suffix = Number(last);
    if (suffix === 0 || size === 0) return 'unsatisfiable';
    return [Math.max(0, size - suffix), size - 1];
  }
  const start = Number(first);
  const end = last === '' ? size - 1 : Number(last);
  if (last !== '' && end < start) return undefined;
  if (start >= size) return 'unsatisfiable';
  return [start, Math.min(end, size - 1)];
}
