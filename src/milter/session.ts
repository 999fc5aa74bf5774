/**
 * session - the milter conversation of one connection (one SMTP session), without the socket: option
 * negotiation, connection facts, then transactions. Each transaction collects the envelope and headers,
 * begins a message with the handler at end of headers, streams the body to its consumer, and answers end
 * of message with the consumer's verdict (reply.ts).
 *
 * Contracts:
 * - handle() is called for one packet at a time (connection.ts waits for it to settle), so consumer calls
 *   never overlap and a pending body() holds back the next packet.
 * - Every command the MTA waits for gets exactly one reply (negotiate.ts expectsReply); others get none.
 * - While a consumer call the MTA waits on is pending, SMFIR_PROGRESS goes out every progressIntervalMs,
 *   so Postfix's milter_content_timeout (300 s per read) never fires. Since progress keeps Postfix
 *   waiting for as long as we send it, the end-of-message decision has a deadline of its own
 *   (decisionDeadlineMs): past it the message is answered `t`, and an accept that comes later is
 *   undone (MessageConsumer.undelivered), as for a verdict that never reached the MTA.
 * - A handler or consumer failure, or a verdict Postfix would refuse, is logged with the queue id and
 *   answered `t` for that message (STYLE 4); the connection stays usable. handle() rejects only with
 *   MilterProtocolError, after which the connection must be closed.
 * - A consumer gets abort() when its transaction ends before end() was called: ABORT, a new MAIL, QUIT,
 *   a failed body(), or connectionLost().
 * - Header bytes kept per message are bounded (MAX_HEADER_BYTES, MAX_FIELD_BYTES). No message content is
 *   logged.
 */
import { DeadlineExceeded, withDeadline } from '../core/deadline.ts';
import { smtpAddress } from '../core/mail-address.ts';
import { MAX_CLIENT_HEADER_BYTES } from '../core/message-admission.ts';
import type { Refusal } from '../core/verdict.ts';
import type { Log } from '../log.ts';
import {
  decodeCommand,
  encodeContinue,
  encodeNegotiation,
  encodeProgress,
  encodeTempfail,
  MilterProtocolError,
  type Packet,
  SMFIC,
} from './codec.ts';
import type { MessageAnswer, MessageConsumer, MilterHandler, MilterHeader } from './handler.ts';
import { MacroStore } from './macros.ts';
import { expectsReply, negotiate } from './negotiate.ts';
import { endOfMessageReply } from './reply.ts';

/**
 * Header bytes and fields kept per message. A message whose header goes past either is refused for
 * good: a 4xx would bring the same message back on every retry, refused the same way each time. The
 * field count also bounds what mailauth searches for each signature's h= names
 * (mail/signature-limits.ts).
 */
export const MAX_HEADER_BYTES = MAX_CLIENT_HEADER_BYTES;
export const MAX_HEADER_FIELDS = 10_000;
/**
 * Recipients kept per message: ten times main.cf's smtpd_recipient_limit (100). No reply goes back to a
 * RCPT (NR_RCPT), so without a bound a peer could grow the list for ever; past it the connection is a
 * protocol error, and Postfix tempfails the message (milter_default_action).
 */
export const MAX_RECIPIENTS = 1000;
export const HEADERS_TOO_LARGE: Refusal = Object.freeze({
  kind: 'reject',
  code: 552,
  dsn: '5.3.4',
  text: `Message header exceeds fixed maximum of ${MAX_HEADER_BYTES} bytes or ${MAX_HEADER_FIELDS} fields`,
});

/**
 * Postfix's cleanup, when a milter is configured, cuts every header field at 60,000 bytes whatever
 * header_size_limit says (cleanup_message.c KLUDGE_HEADER_LIMIT: room for libmilter's 64 KiB packets),
 * and says nothing. Measured on Postfix 3.7 (`Name:` and the value, lines joined by LF, as we receive
 * it): a field of up to 60,000 bytes is stored whole; a longer one loses the line that crosses 60,000
 * and every line after it when that line starts past 54,000 bytes (90%), else it is cut inside that
 * line at 60,000. So a field that was cut reaches us with 54,000 to 60,000 bytes, and one that long
 * may have been: it is refused for good rather than stored other than sent. Whole fields of 54,000 to
 * 60,000 bytes are refused with it (a 60,500-byte field in 5,000-byte lines was stored as 55,010).
 */
export const MAX_FIELD_BYTES = 54_000 - 1;
export const HEADER_FIELD_TOO_LARGE: Refusal = Object.freeze({
  kind: 'reject',
  code: 552,
  dsn: '5.3.4',
  text: `Message header field exceeds fixed maximum of ${MAX_FIELD_BYTES} bytes`,
});

interface Transaction {
  envelopeFrom: string;
  mailArgs: string[];
  recipients: string[];
  headers: MilterHeader[];
  headerBytes: number;
  /** The header went past a limit: every later answer is this refusal. */
  tooLarge: Refusal | undefined;
  queueId: string;
  consumer: MessageConsumer | undefined;
  /** end() or abort() has been called; the consumer gets nothing more. */
  settled: boolean;
  /** Answered (or to be answered) `t`; the rest of the message is not shown to the core. */
  failed: boolean;
  /** The handler has heard the message's answer (MilterHandler.answered). */
  answered: boolean;
}

type Answer = 'continue' | 'tempfail' | Refusal;

export interface MilterSessionOptions {
  handler: MilterHandler;
  log: Log;
  progressIntervalMs: number;
  /** How long the end-of-message decision may take before the message is answered `t`. */
  decisionDeadlineMs: number;
  /** Correlates this session's log lines. */
  id: number;
  /** Writes a reply; false when the connection can no longer be written to (nothing was sent). */
  send: (reply: Buffer) => boolean;
}

export class MilterSession {
  readonly #handler: MilterHandler;
  readonly #log: Log;
  readonly #progressMs: number;
  readonly #deadlineMs: number;
  readonly #id: number;
  readonly #send: (reply: Buffer) => boolean;
  /** Negotiated SMFIP_* bits; undefined until SMFIC_OPTNEG. */
  #protocol: number | undefined;
  #clientAddress = '';
  #clientName: string | null = null;
  #helo: string | null = null;
  readonly #macros = new MacroStore();
  #tx: Transaction | undefined;
  #lost = false;

  constructor(options: MilterSessionOptions) {
    this.#handler = options.handler;
    this.#log = options.log;
    this.#progressMs = options.progressIntervalMs;
    this.#deadlineMs = options.decisionDeadlineMs;
    this.#id = options.id;
    this.#send = options.send;
  }

  /** Between MAIL and the end of its message (or its ABORT). */
  get inTransaction(): boolean {
    return this.#tx !== undefined;
  }

  /** Handles one packet; 'close' when the connection should end (QUIT, refused negotiation). */
  async handle(packet: Packet): Promise<'continue' | 'close'> {
    const command = decodeCommand(packet);
    if (this.#protocol === undefined) {
      if (command.kind !== 'optneg') throw new MilterProtocolError(`'${packet.command}' before SMFIC_OPTNEG`);
      const result = negotiate(command);
      if (!result.ok) {
        this.#log({
          level: 'warn',
          msg: 'milter negotiation refused; disconnecting',
          session: this.#id,
          reason: result.reason,
        });
        return 'close';
      }
      this.#protocol = result.reply.protocol;
      this.#send(encodeNegotiation(result.reply));
      return 'continue';
    }
    let answer: Answer = 'continue';
    switch (command.kind) {
      case 'optneg':
        throw new MilterProtocolError('second SMFIC_OPTNEG');
      case 'macro':
        this.#macros.set(command.stage, command.macros);
        break;
      case 'connect':
        this.#clientAddress = command.family === '4' || command.family === '6' ? command.address : '';
        // Postfix sends "[ip]" for a client without a verified name, "unknown" when even the address is.
        this.#clientName = /^\[.*\]$|^unknown$|^$/.test(command.hostname) ? null : command.hostname;
        break;
      case 'helo':
        this.#helo = command.name;
        break;
      case 'mail':
        this.#beginTransaction(command.args);
        break;
      case 'rcpt': {
        const { recipients } = this.#transaction('RCPT');
        if (recipients.length >= MAX_RECIPIENTS) {
          throw new MilterProtocolError(`more than ${MAX_RECIPIENTS} recipients in one message`);
        }
        recipients.push(smtpAddress(command.args[0] ?? ''));
        break;
      }
      case 'header':
        answer = this.#onHeader(command);
        break;
      case 'eoh':
        answer = this.#onEndOfHeaders();
        break;
      case 'body':
        answer = await this.#onBody(command.chunk);
        break;
      case 'eob':
        await this.#onEndOfMessage(command.chunk);
        return 'continue';
      case 'abort':
        this.#endTransaction();
        return 'continue';
      case 'quit':
        this.#endTransaction();
        return 'close';
      case 'quitNewConnection':
        this.#endTransaction();
        this.#clientAddress = '';
        this.#clientName = null;
        this.#helo = null;
        this.#macros.clear();
        return 'continue';
      case 'unrecognized':
        this.#log({
          level: 'warn',
          msg: 'milter command not recognized; ignored',
          session: this.#id,
          command: command.code,
        });
        return 'continue';
      case 'data':
      case 'unknown':
        break;
    }
    if (expectsReply(packet.command, this.#protocol)) {
      this.#send(answerPacket(answer));
      if (answer !== 'continue' && this.#tx) this.#answered(this.#tx, answer);
    }
    return 'continue';
  }

  /** Tells the handler, once per message, what the MTA was told (MilterHandler.answered). */
  #answered(tx: Transaction, answer: MessageAnswer): void {
    if (tx.answered) return;
    tx.answered = true;
    const queueId = tx.queueId || (this.#macros.snapshot().get('i') ?? '');
    try {
      this.#handler.answered?.({ queueId, recipients: [...tx.recipients] }, answer);
    } catch (error) {
      this.#log({ level: 'error', msg: 'milter answered() failed', session: this.#id, error: String(error) });
    }
  }

  /** The socket closed: a message in progress is aborted. */
  connectionLost(): void {
    this.#lost = true;
    this.#endTransaction();
  }

  #beginTransaction(args: string[]): void {
    this.#endTransaction('M');
    this.#tx = {
      envelopeFrom: smtpAddress(args[0] ?? ''),
      mailArgs: args.slice(1),
      recipients: [],
      headers: [],
      headerBytes: 0,
      queueId: '',
      consumer: undefined,
      settled: false,
      failed: false,
      tooLarge: undefined,
      answered: false,
    };
  }

  #transaction(stage: string): Transaction {
    if (!this.#tx) throw new MilterProtocolError(`${stage} outside a transaction`);
    return this.#tx;
  }

  #onHeader(header: { name: string; value: string }): Answer {
    const tx = this.#transaction('HEADER');
    if (tx.consumer) throw new MilterProtocolError('HEADER after EOH');
    if (tx.failed) return failure(tx);
    // Name and value arrive as latin1 strings: their lengths are byte counts.
    const fieldBytes = header.name.length + 1 + header.value.length;
    tx.headerBytes += fieldBytes + 2;
    const refusal =
      fieldBytes > MAX_FIELD_BYTES
        ? HEADER_FIELD_TOO_LARGE
        : tx.headerBytes > MAX_HEADER_BYTES || tx.headers.length >= MAX_HEADER_FIELDS
          ? HEADERS_TOO_LARGE
          : undefined;
    if (refusal) {
      this.#log({ level: 'warn', msg: 'milter message header too large; refused', session: this.#id });
      tx.failed = true;
      tx.tooLarge = refusal;
      tx.headers = [];
      return refusal;
    }
    tx.headers.push({ name: header.name, value: header.value });
    return 'continue';
  }

  #onEndOfHeaders(): Answer {
    const tx = this.#transaction('EOH');
    if (tx.consumer) throw new MilterProtocolError('second EOH');
    if (tx.failed) return failure(tx);
    const macros = this.#macros.snapshot();
    tx.queueId = macros.get('i') ?? '';
    const envelope = {
      queueId: tx.queueId,
      clientAddress: this.#clientAddress,
      clientName: this.#clientName,
      helo: this.#helo,
      envelopeFrom: tx.envelopeFrom,
      mailArgs: tx.mailArgs,
      recipients: [...tx.recipients],
      macros,
    };
    const headers = tx.headers;
    tx.headers = [];
    try {
      tx.consumer = this.#handler.beginMessage(envelope, headers);
      return 'continue';
    } catch (error) {
      this.#failed(tx, 'beginMessage', error);
      return 'tempfail';
    }
  }

  async #onBody(chunk: Buffer): Promise<Answer> {
    const tx = this.#transaction('BODY');
    if (tx.failed) return failure(tx);
    const consumer = tx.consumer;
    if (!consumer) throw new MilterProtocolError('BODY before EOH');
    try {
      await this.#withProgress(() => consumer.body(chunk), expectsReply(SMFIC.BODY, this.#protocol ?? 0));
      return 'continue';
    } catch (error) {
      if (this.#tx === tx) this.#failed(tx, 'body', error);
      return 'tempfail';
    }
  }

  /** Decides the message and writes its reply (the verdict, or `t`). */
  async #onEndOfMessage(chunk: Buffer): Promise<void> {
    const tx = this.#transaction('BODYEOB');
    // libmilter accepts a last body chunk inside BODYEOB; Postfix sends it as a separate BODY.
    if (chunk.length > 0 && (await this.#onBody(chunk)) !== 'continue') tx.failed = true;
    const consumer = tx.consumer;
    if (!tx.failed && !consumer) {
      this.#log({
        level: 'warn',
        msg: 'milter end of message without end of headers; tempfail',
        session: this.#id,
      });
    }
    if (tx.failed || !consumer) {
      this.#endTransaction();
      this.#send(answerPacket(failure(tx)));
      this.#answered(tx, failure(tx));
      return;
    }
    tx.settled = true;
    let reply: Buffer;
    // end() resolved, and its verdict is not the reply: the consumer may undo it (handler.ts).
    let ended = false;
    let replaced = false;
    let sent: MessageAnswer = 'tempfail';
    const ending = consumer.end();
    try {
      const answer = await this.#withProgress(
        () => withDeadline(ending, this.#deadlineMs, 'the end-of-message decision'),
        true,
      );
      ended = true;
      reply = endOfMessageReply(answer);
      sent = answer.verdict;
    } catch (error) {
      this.#failed(tx, 'end', error);
      reply = encodeTempfail();
      replaced = ended;
      // The MTA hears `t`: whatever end() did, or does once past the deadline, is undone.
      const undo = () => this.#undelivered(tx, consumer);
      if (error instanceof DeadlineExceeded) ending.then(undo, undo);
      else if (!ended) undo();
    }
    // Lost before the verdict, or while it was decided: the socket may be closed (Postfix gave up) a
    // moment before the session hears of it, and then the reply is not written either.
    let lost = this.#tx !== tx;
    if (!lost) {
      this.#endTransaction();
      lost = !this.#send(reply);
    }
    if (lost) {
      const fields = { session: this.#id, queue_id: tx.queueId };
      this.#log({ level: 'warn', msg: 'milter connection lost before the verdict was sent', ...fields });
      replaced = ended;
      sent = 'tempfail'; // Postfix applies milter_default_action
    }
    if (replaced) this.#undelivered(tx, consumer);
    else if (ended) consumer.delivered?.();
    this.#answered(tx, sent);
  }

  /** end() resolved but its verdict will not reach the MTA: the consumer may undo it (handler.ts). */
  #undelivered(tx: Transaction, consumer: MessageConsumer): void {
    consumer.undelivered().catch((error: unknown) => {
      // What stays is left to the reservation clean-up job (RESERVATION_TTL_SECONDS).
      this.#log({
        level: 'error',
        msg: 'milter could not undo a verdict that never reached the MTA',
        session: this.#id,
        queue_id: tx.queueId,
        error: error instanceof Error ? error.stack : String(error),
      });
    });
  }

  /** Runs a consumer call; while it is pending and the MTA waits for our reply, keeps it waiting. */
  async #withProgress<T>(call: () => Promise<T>, progress: boolean): Promise<T> {
    // A call that never settles must not keep a timer alive after the connection is gone.
    const tick = () => (this.#lost ? clearInterval(timer) : this.#send(encodeProgress()));
    const timer = progress ? setInterval(tick, this.#progressMs) : undefined;
    try {
      return await call();
    } finally {
      clearInterval(timer);
    }
  }

  #failed(tx: Transaction, stage: string, error: unknown): void {
    tx.failed = true;
    this.#log({
      level: 'error',
      msg: 'milter handler failed',
      session: this.#id,
      stage,
      queue_id: tx.queueId,
      error: error instanceof Error ? error.stack : String(error),
    });
    this.#settle(tx);
  }

  /** Aborts the consumer unless it already had end() or abort(). */
  #settle(tx: Transaction): void {
    if (tx.settled || !tx.consumer) return;
    tx.settled = true;
    try {
      tx.consumer.abort();
    } catch (error) {
      const where = { session: this.#id, queue_id: tx.queueId, error: String(error) };
      this.#log({ level: 'error', msg: 'milter consumer abort failed', ...where });
    }
  }

  /** Ends the transaction (aborting its consumer) and forgets its macros, except `keep`'s. */
  #endTransaction(keep?: string): void {
    if (this.#tx) this.#settle(this.#tx);
    this.#tx = undefined;
    this.#macros.endTransaction(keep);
  }
}

/** The answer for a transaction that failed: a header limit's refusal for good, anything else for now. */
function failure(tx: Transaction): Refusal | 'tempfail' {
  return tx.tooLarge ?? 'tempfail';
}

function answerPacket(answer: Answer): Buffer {
  if (answer === 'continue') return encodeContinue();
  if (answer === 'tempfail') return encodeTempfail();
  return endOfMessageReply({ verdict: answer });
}
