/**
 * connection - one milter socket: frames the bytes into packets and hands them to the MilterSession one
 * at a time, writing its replies.
 *
 * Contracts:
 * - Reading pauses while a packet is handled, so a consumer's pending body() or end() holds back the next
 *   packet, and memory stays bounded by one read chunk plus one partial packet (codec.ts).
 * - A protocol violation (bad framing, a packet that does not parse, a command out of place) is logged
 *   and the socket destroyed; Postfix then applies milter_default_action (tempfail) to that SMTP session.
 * - When the socket closes, the session is told, so a message in progress is aborted.
 * - shutdown(): ends the connection once no transaction is in progress; destroy() at once.
 */
import type { Socket } from 'node:net';
import type { Log } from '../log.ts';
import { coalesceWrites } from '../net/coalesce-writes.ts';
import { FrameDecoder, MilterProtocolError, type Packet } from './codec.ts';
import type { MilterHandler } from './handler.ts';
import { MilterSession } from './session.ts';

/** Longer than any Postfix milter timeout and smtpd_timeout (300 s), so only dead peers are dropped. */
export const IDLE_TIMEOUT_MS = 15 * 60 * 1000;

export interface MilterConnectionOptions {
  handler: MilterHandler;
  log: Log;
  progressIntervalMs: number;
  decisionDeadlineMs: number;
  /** Correlates this connection's log lines. */
  id: number;
}

export class MilterConnection {
  readonly #socket: Socket;
  readonly #log: Log;
  readonly #id: number;
  readonly #session: MilterSession;
  readonly #decoder = new FrameDecoder();
  readonly #queue: Packet[] = [];
  #busy = false;
  #stopping = false;
  #hungUp = false;

  constructor(socket: Socket, options: MilterConnectionOptions) {
    this.#socket = socket;
    // Replies sent in one tick (header edits, then continue) leave in one write.
    coalesceWrites(socket);
    this.#log = options.log;
    this.#id = options.id;
    this.#session = new MilterSession({ ...options, send: (reply) => this.#write(reply) });
    socket.setTimeout(IDLE_TIMEOUT_MS, () => {
      if (this.#busy) return;
      this.#log({ level: 'warn', msg: 'milter connection idle; disconnecting', session: this.#id });
      socket.destroy();
    });
    socket.on('error', (error) => {
      this.#log({ level: 'warn', msg: 'milter connection error', session: this.#id, error: error.message });
    });
    socket.once('close', () => {
      this.#queue.length = 0;
      this.#session.connectionLost();
    });
    socket.on('data', (chunk: Buffer) => this.#data(chunk));
  }

  shutdown(): void {
    this.#stopping = true;
    if (!this.#busy && !this.#session.inTransaction && this.#queue.length === 0) this.#hangUp();
  }

  destroy(): void {
    this.#socket.destroy();
  }

  #data(chunk: Buffer): void {
    if (this.#hungUp) return;
    try {
      for (const packet of this.#decoder.push(chunk)) this.#queue.push(packet);
    } catch (error) {
      this.#fail(error);
      return;
    }
    this.#next();
  }

  #next(): void {
    if (this.#busy || this.#socket.destroyed || this.#hungUp) return;
    const packet = this.#queue.shift();
    if (!packet) {
      if (this.#stopping && !this.#session.inTransaction) this.#hangUp();
      else if (this.#socket.writableNeedDrain) this.#socket.once('drain', () => this.#socket.resume());
      else this.#socket.resume();
      return;
    }
    this.#busy = true;
    this.#socket.pause();
    this.#session.handle(packet).then(
      (next) => {
        this.#busy = false;
        if (next === 'close') this.#hangUp();
        else this.#next();
      },
      (error: unknown) => {
        this.#busy = false;
        this.#fail(error);
      },
    );
  }

  /**
   * Flushes what we wrote, then closes both ways. Not end() alone: Postfix reads its milter socket only
   * when it next has an event to send, so it would not answer our FIN until then, and close() would
   * wait the whole grace for an idle session's connection (Postfix then sees end of file, and the
   * session gets milter_default_action).
   */
  #hangUp(): void {
    this.#hungUp = true;
    this.#socket.destroySoon();
  }

  /** False when the socket is closed or closing: the reply is not written (session.ts). */
  #write(reply: Buffer): boolean {
    if (this.#socket.destroyed || !this.#socket.writable) return false;
    this.#socket.write(reply);
    return true;
  }

  #fail(error: unknown): void {
    if (error instanceof MilterProtocolError) {
      this.#log({
        level: 'warn',
        msg: 'milter protocol error; disconnecting',
        session: this.#id,
        reason: error.message,
      });
    } else {
      const detail = error instanceof Error ? error.stack : String(error);
      this.#log({
        level: 'error',
        msg: 'milter session failed; disconnecting',
        session: this.#id,
        error: detail,
      });
    }
    this.#socket.destroy();
  }
}
