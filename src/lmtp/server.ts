/**
 * server - the LMTP receiver (RFC 2033) that Postfix delivers accepted mail to (virtual_transport =
 * lmtp:inet:HOST:PORT or lmtp:unix:PATH), on nodemailer's smtp-server in LMTP mode.
 *
 * Listens on:  the given Listen (TCP, port 0 picks a free port; or a unix socket, whose stale file is
 *              removed first; a live one is left alone and listening fails with EADDRINUSE).
 * Reads:       LHLO, XFORWARD (only IDENT is used: Postfix's queue id, the idempotency key; NAME and HELO
 *              are left out, xforward.ts), MAIL (any reverse-path Postfix sends, mail-from.ts), RCPT
 *              (at most MAX_RECIPIENTS per transaction; smtp-server turns an IDN domain into Unicode,
 *              which core/mail-address.ts's inMailDomain reads back), DATA. No AUTH, no STARTTLS, no
 *              SIZE limit: Postfix and the milter enforced the size, and a refusal here would be a 5xx
 *              after queueing (DESIGN decision 1).
 * Decides:     nothing; each DATA goes to handler.deliver, which owns the data stream from then on.
 * Writes:      one reply per accepted RCPT, in RCPT order, duplicates included (RFC 2033 section 4.2):
 *              `250 2.0.0 ...` or the handler's 4xx. Never a 5xx: a 5xx from the handler, or a handler
 *              that fails, becomes `451 4.3.0`.
 * On failure:  a connection that drops mid-DATA ends that delivery (its stores roll back); Postfix
 *              retries. Other connections are unaffected.
 * close():     stops accepting; every further command is answered `421` (smtp-server does this once
 *              closing); deliveries in progress finish and are answered for up to closeGraceMs, then
 *              every connection left gets `421 4.3.2 <hostname> shutting down, try again later` and is
 *              closed (a delivery cut off so rolls back; Postfix retries it); resolves when the
 *              listener is closed.
 * Security:    anyone who can connect can store mail into any inbox: listen on loopback or on a unix
 *              socket that only Postfix can reach.
 */

import type { Socket } from 'node:net';
import {
  SMTPServer,
  type SMTPServerDataResult,
  type SMTPServerDataStream,
  type SMTPServerEnvelope,
  type SMTPServerSession,
} from 'smtp-server';
import type { Listen } from '../config/config.ts';
import type { DeliveryService, DeliveryVerdict } from '../core/delivery-service.ts';
import type { Log } from '../log.ts';
import { coalesceWrites } from '../net/coalesce-writes.ts';
import { listenOn } from '../net/listen.ts';
import { paceBufferGarbage } from './buffer-pacer.ts';
import { dataScan } from './data-scan.ts';
import { mailFromParser } from './mail-from.ts';
import { smtpServerVersion } from './smtp-server-patch.ts';
import { xforwardReader } from './xforward.ts';

export const CLOSE_GRACE_MS = 30_000;

/**
 * How long a connection may go without a byte from Postfix (ms): smtp-server's default, 60 s, cut off
 * a message over the read-ahead that waited that long for a store slot (its bytes stop flowing while
 * it waits, and smtp-server answered `421 Timeout`), below the store's own bounds (stallMs 60 s,
 * storeDeadlineMs 180 s). Postfix's lmtp_data_done_timeout, the longest it waits for us, is 600 s; an
 * idle cached connection is closed by Postfix long before (lmtp_connection_cache_time_limit, 2 s).
 */
export const SOCKET_TIMEOUT_MS = 600_000;

/**
 * Recipients per transaction (duplicates counted): Postfix sends at most
 * lmtp_destination_recipient_limit (8, postfix/main.cf); the bound keeps a peer that sends RCPT
 * without end from growing a list without end. Past it: `452 4.5.3` (try later), never a 5xx.
 */
export const MAX_RECIPIENTS = 1000;

/** Reply when the handler failed or answered something the receiver must not send (DESIGN decision 1). */
const TEMPORARY_FAILURE = { code: 451, dsn: '4.3.0', text: 'temporary failure, try again later' } as const;

export interface LmtpHandler {
  deliver: DeliveryService['deliver'];
}

export interface LmtpServer {
  server: SMTPServer;
  /** `inet:host:port` with the port actually bound, or `unix:path`. */
  address: string;
  /** The bound TCP port; absent for a unix socket. */
  port?: number;
  /** Idempotent: later calls return the first call's promise. */
  close(): Promise<void>;
}

export interface LmtpServerOptions {
  listen: Listen;
  handler: LmtpHandler;
  log: Log;
  /** Our name in the greeting and the LHLO reply. */
  hostname: string;
  /** Only logged when exceeded: Postfix enforced the limit, refusing now would be backscatter. */
  maxMessageBytes: number;
  closeGraceMs?: number;
  /** Default SOCKET_TIMEOUT_MS. */
  socketTimeoutMs?: number;
}

/** One reply for smtp-server's per-recipient array: a string is sent after `250 `, an Error as its code. */
export function toReply(verdict: DeliveryVerdict | undefined): SMTPServerDataResult {
  if (verdict?.kind === 'accept') return `${verdict.dsn} ${verdict.text}`;
  const refusal = verdict && verdict.code >= 400 && verdict.code < 500 ? verdict : TEMPORARY_FAILURE;
  return Object.assign(new Error(`${refusal.dsn} ${refusal.text}`), { responseCode: refusal.code });
}

export async function startLmtpServer(options: LmtpServerOptions): Promise<LmtpServer> {
  const { listen, handler, log, hostname } = options;
  for (const patch of [dataScan, mailFromParser, xforwardReader]) {
    if (patch.install()) continue;
    const msg = `smtp-server version not known to ${patch.module}: ${patch.without}`;
    log({ level: 'warn', msg, version: smtpServerVersion() });
  }
  const graceMs = options.closeGraceMs ?? CLOSE_GRACE_MS;
  // smtp-server merges a repeated RCPT into one envelope entry, but RFC 2033 wants one reply per
  // accepted RCPT: the accepted addresses are kept here, per transaction (envelope object).
  const accepted = new WeakMap<SMTPServerEnvelope, string[]>();
  /** The XFORWARD IDENT (Postfix's queue id) each transaction's MAIL came with. */
  const idents = new WeakMap<SMTPServerEnvelope, string>();
  const deliveries = new Set<Promise<void>>();
  let closing: Promise<void> | undefined;

  const server = new SMTPServer({
    lmtp: true,
    name: hostname,
    banner: 'agent inbox receiver',
    logger: false,
    useXForward: true,
    disabledCommands: ['AUTH', 'STARTTLS'],
    disableReverseLookup: true,
    hideENHANCEDSTATUSCODES: true,
    // smtp-server's default, stated: without the DSN extension Postfix keeps NOTIFY, ORCPT, RET and
    // ENVID to itself (no notice ever leaves), so smtp-server's checks of their syntax cannot refuse a
    // queued message with a 501.
    hideDSN: true,
    socketTimeout: options.socketTimeoutMs ?? SOCKET_TIMEOUT_MS,
    // close() below sends our 421 at the end of the grace; smtp-server's own is only a fallback.
    closeTimeout: graceMs + 5_000,
    // Every sender is taken (the milter decided before queueing); answered at once, not after
    // smtp-server's default setImmediate, so MAIL's reply leaves with XFORWARD's (coalesce-writes.ts).
    // XFORWARD attributes outlive the transaction in smtp-server (MAIL-FACTS D.3), RSET included: MAIL
    // takes the IDENT sent before it for its own transaction and forgets it (XFORWARD_README: the
    // attributes last until the end of the transaction).
    onMailFrom(_address, session, callback) {
      const ident = session.xForward.get('IDENT');
      session.xForward.clear();
      if (typeof ident === 'string' && ident !== '') idents.set(session.envelope, ident);
      callback();
    },
    onRcptTo(address, session, callback) {
      const list = accepted.get(session.envelope) ?? [];
      if (list.length >= MAX_RECIPIENTS) {
        const error = new Error(`4.5.3 too many recipients, send the others in another transaction`);
        return callback(Object.assign(error, { responseCode: 452 }));
      }
      list.push(address.address);
      accepted.set(session.envelope, list);
      callback();
    },
    onData(stream, session, callback) {
      const delivery: Promise<void> = onData(stream, session)
        .then(
          (replies) => callback(null, replies),
          (error: unknown) => {
            log({ level: 'error', msg: 'lmtp data handling failed', error: String(error) });
            const count = (accepted.get(session.envelope) ?? session.envelope.rcptTo).length;
            callback(
              null,
              Array.from({ length: count }, () => toReply(undefined)),
            );
          },
        )
        .finally(() => deliveries.delete(delivery));
      deliveries.add(delivery);
    },
  });
  server.on('error', (error) => log({ level: 'error', msg: 'lmtp listener error', error: error.message }));
  // One syscall for the replies to a pipelined XFORWARD, MAIL, RCPT and DATA, not four.
  server.server.on('connection', coalesceWrites);

  async function onData(
    stream: SMTPServerDataStream,
    session: SMTPServerSession,
  ): Promise<SMTPServerDataResult[]> {
    const queueId = idents.get(session.envelope) ?? null;
    const envelopeFrom = session.envelope.mailFrom ? session.envelope.mailFrom.address : '';
    const recipients = accepted.get(session.envelope) ?? session.envelope.rcptTo.map((r) => r.address);
    let verdicts: DeliveryVerdict[] = [];
    try {
      verdicts = await handler.deliver({ queueId, envelopeFrom, recipients }, stream);
    } catch (error) {
      log({ level: 'error', msg: 'delivery handler failed', queue_id: queueId, error: String(error) });
    }
    // The handler owns the stream and reads it to the end; should it not, the rest is discarded here
    // (smtp-server replies only after the stream has ended).
    if (stream.readable) stream.resume();
    if (stream.byteLength > options.maxMessageBytes + 1024 * 1024) {
      log({
        level: 'warn',
        msg: 'message larger than the limit',
        queue_id: queueId,
        bytes: stream.byteLength,
      });
    }
    if (verdicts.length !== recipients.length) {
      log({ level: 'error', msg: 'delivery handler gave the wrong number of verdicts', queue_id: queueId });
    }
    return recipients.map((_, i) => toReply(verdicts[i]));
  }

  // Every byte read counts towards the pacer's next check (the listener only observes; smtp-server
  // reads the socket through its own pipe).
  const pacer = paceBufferGarbage();
  server.server.on('connection', (socket: Socket) => {
    socket.on('data', (piece: Buffer) => pacer.received(piece.length));
  });
  const { address, port } = await listenOn(server, listen, () => server.server.address()).catch(
    (error: unknown) => {
      pacer.stop();
      throw error;
    },
  );

  const close = () => {
    closing ??= (async () => {
      const stopped = new Promise<void>((resolve) => server.close(() => resolve()));
      let timer: NodeJS.Timeout | undefined;
      const grace = new Promise<void>((resolve) => {
        timer = setTimeout(resolve, graceMs);
      });
      await Promise.race([Promise.allSettled([...deliveries]), grace]);
      clearTimeout(timer);
      for (const connection of server.connections) {
        connection.send(421, `4.3.2 ${hostname} shutting down, try again later`);
        connection.close();
      }
      await stopped;
      pacer.stop();
    })();
    return closing;
  };
  return port === undefined ? { server, address, close } : { server, address, port, close };
}
