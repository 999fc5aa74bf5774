/**
 * session - one Postfix policy connection: decode requests, ask the handler's PolicyConnection one
 * request at a time, write one `action=` reply per request, in order.
 *
 * Contracts:
 * - Requests are decided strictly one at a time in arrival order; requests that arrive before the
 *   previous reply (pipelining) wait in a queue. Reading pauses while requests wait and while replies
 *   are not drained, so memory stays bounded by one read chunk whatever the peer sends.
 * - Protocol violation, handler rejection or an unencodable verdict: log a warning and destroy the
 *   socket without a reply (SMTPD_POLICY_README: "in case of trouble the policy server must not send a
 *   reply"); Postfix retries, then applies its default_action. Nothing about the failure reaches Postfix.
 * - A decision that takes longer than decisionDeadlineMs (a stalled database) is internal trouble too:
 *   logged, and the socket destroyed without a reply.
 * - PolicyConnection.close() is called exactly once, when the socket has closed.
 * - shutdown(): a decision in progress finishes and its reply is written; then the socket is ended.
 *   Requests queued behind it get no reply (Postfix retries them on a new connection).
 */
import type { Socket } from 'node:net';
import { withDeadline } from '../core/deadline.ts';
import type { Verdict } from '../core/verdict.ts';
import type { Log } from '../log.ts';
import { encodeAction, PolicyProtocolError, PolicyRequestReader } from './codec.ts';
import type { PolicyConnection, PolicyHandler, PolicyRequest } from './handler.ts';

/** Longer than Postfix's smtpd_policy_service_max_idle (300 s), so only dead peers are dropped. */
export const IDLE_TIMEOUT_MS = 15 * 60 * 1000;
/** Under Postfix's smtpd_policy_service_timeout (100 s), so the failure is ours to log. */
export const DEFAULT_DECISION_DEADLINE_MS = 60_000;

export class PolicySession {
  readonly #socket: Socket;
  readonly #log: Log;
  readonly #peer: string;
  readonly #reader = new PolicyRequestReader();
  readonly #queue: PolicyRequest[] = [];
  #connection: PolicyConnection | undefined;
  #busy = false;
  #stopping = false;
  readonly #deadlineMs: number;

  constructor(
    socket: Socket,
    handler: PolicyHandler,
    log: Log,
    decisionDeadlineMs = DEFAULT_DECISION_DEADLINE_MS,
  ) {
    this.#socket = socket;
    this.#log = log;
    this.#deadlineMs = decisionDeadlineMs;
    this.#peer = socket.remoteAddress ? `${socket.remoteAddress}:${socket.remotePort}` : 'unix';
    socket.setTimeout(IDLE_TIMEOUT_MS, () => {
      if (!this.#busy) socket.destroy();
    });
    socket.on('error', () => {}); // a reset peer; 'close' follows and does the cleanup
    socket.once('close', () => this.#closed());
    try {
      this.#connection = handler.connect();
    } catch (error) {
      this.#fail('policy handler could not take the connection; disconnecting', error);
      return;
    }
    socket.on('data', (chunk: Buffer) => this.#data(chunk));
  }

  /** Stop reading; finish the decision in progress (its reply is written), then end the connection. */
  shutdown(): void {
    this.#stopping = true;
    this.#queue.length = 0;
    this.#socket.pause();
    // destroySoon: flush what was written, then close both ways (end() alone waits for Postfix to hang up).
    if (!this.#busy) this.#socket.destroySoon();
  }

  destroy(): void {
    this.#socket.destroy();
  }

  #data(chunk: Buffer): void {
    if (this.#stopping) return;
    try {
      this.#queue.push(...this.#reader.push(chunk));
    } catch (error) {
      if (!(error instanceof PolicyProtocolError)) throw error;
      this.#log({
        level: 'warn',
        msg: 'policy protocol error; disconnecting',
        reason: error.message,
        peer: this.#peer,
      });
      this.#socket.destroy();
      return;
    }
    this.#next();
  }

  #next(): void {
    const connection = this.#connection;
    if (!connection || this.#busy || this.#socket.destroyed) return;
    const request = this.#queue.shift();
    if (!request) {
      // Nothing waits: read on, once the peer has taken our replies.
      if (this.#stopping) return;
      if (this.#socket.writableNeedDrain) this.#socket.once('drain', () => this.#socket.resume());
      else this.#socket.resume();
      return;
    }
    this.#busy = true;
    this.#socket.pause();
    const decided = withDeadline(
      Promise.resolve().then(() => connection.decide(request)),
      this.#deadlineMs,
      'the policy decision',
    );
    decided
      .then((verdict) => ({ verdict, reply: encodeAction(verdict) }))
      .then(
        ({ verdict, reply }) => {
          this.#busy = false;
          if (this.#socket.destroyed) {
            this.#answered(connection, request, null);
            return;
          }
          this.#socket.write(reply);
          this.#answered(connection, request, verdict);
          if (this.#stopping) this.#socket.destroySoon();
          else this.#next();
        },
        (error: unknown) => {
          this.#busy = false;
          this.#fail('policy decision failed; disconnecting without a reply', error, request);
          this.#answered(connection, request, null);
        },
      );
  }

  #answered(connection: PolicyConnection, request: PolicyRequest, verdict: Verdict | null): void {
    try {
      connection.answered?.(request, verdict);
    } catch (error) {
      this.#log({ level: 'error', msg: 'policy answered() failed', error: String(error) });
    }
  }

  #fail(msg: string, error: unknown, request?: PolicyRequest): void {
    this.#log({
      level: 'warn',
      msg,
      peer: this.#peer,
      protocol_state: request?.protocolState,
      instance: request?.instance,
      queue_id: request?.queueId,
      error: error instanceof Error ? error.stack : String(error),
    });
    this.#socket.destroy();
  }

  #closed(): void {
    this.#queue.length = 0;
    const connection = this.#connection;
    this.#connection = undefined;
    if (!connection) return;
    try {
      connection.close();
    } catch (error) {
      this.#log({
        level: 'warn',
        msg: 'policy connection close failed',
        peer: this.#peer,
        error: error instanceof Error ? error.stack : String(error),
      });
    }
  }
}
