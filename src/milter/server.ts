/**
 * server - the milter daemon's socket: accepts Postfix's milter connections (smtpd_milters, one
 * connection per SMTP session) and gives each to a MilterConnection.
 *
 * Listens on:   MILTER_PORT (config milterListen): host:port, or a unix socket path (a stale socket file
 *               left by a dead process is removed first; a live one is left alone and listening fails).
 * Reads/writes: nothing itself; the handler does.
 * On failure:   a broken connection is logged and dropped; Postfix applies milter_default_action
 *               (tempfail) to that session. A handler failure fails one message temporarily.
 * Security:     speak only to Postfix: listen on loopback or a unix socket the Postfix user can reach.
 *               Packets are bounded (codec.ts); no message content is logged.
 */

import net from 'node:net';
import type { Listen } from '../config/config.ts';
import type { Log } from '../log.ts';
import { listenOn } from '../net/listen.ts';
import { MilterConnection } from './connection.ts';
import type { MilterHandler } from './handler.ts';

/** How long close() lets a transaction in progress finish before cutting it off. */
export const CLOSE_GRACE_MS = 5_000;
/** Well under Postfix's milter_content_timeout (300 s). */
export const DEFAULT_PROGRESS_INTERVAL_MS = 10_000;
/**
 * The longest an end-of-message decision may take (session.ts). DNS is bounded by the resolver's
 * timeouts and each database statement by its lock timeout (storage/database.ts); this bounds the rest,
 * such as a database host gone without a reset, well inside the 10 minutes a sender waits after DATA
 * (RFC 5321 4.5.3.2.6).
 */
export const DEFAULT_DECISION_DEADLINE_MS = 120_000;

export interface MilterServerOptions {
  listen: Listen;
  handler: MilterHandler;
  log: Log;
  /** How often SMFIR_PROGRESS is sent while a consumer call is pending. */
  progressIntervalMs?: number;
  /** How long an end-of-message decision may take before the message is answered `t`. */
  decisionDeadlineMs?: number;
  /** How long close() lets transactions in progress finish (default CLOSE_GRACE_MS). */
  closeGraceMs?: number;
}

export interface MilterServer {
  server: net.Server;
  /** In Postfix's smtpd_milters syntax: `inet:127.0.0.1:PORT` or `unix:/path`. */
  address: string;
  /** The bound TCP port; absent for a unix socket. */
  port?: number;
  /** Stops accepting; idle sessions end at once, the others after their transaction or the grace. */
  close(): Promise<void>;
}

export async function startMilterServer(options: MilterServerOptions): Promise<MilterServer> {
  const { handler, log } = options;
  const progressIntervalMs = options.progressIntervalMs ?? DEFAULT_PROGRESS_INTERVAL_MS;
  if (!(progressIntervalMs >= 1))
    throw new RangeError(`progressIntervalMs must be >= 1 (got ${progressIntervalMs})`);
  const connections = new Set<MilterConnection>();
  let nextId = 1;
  const server = net.createServer({ noDelay: true }, (socket) => {
    const connection = new MilterConnection(socket, {
      handler,
      log,
      progressIntervalMs,
      decisionDeadlineMs: options.decisionDeadlineMs ?? DEFAULT_DECISION_DEADLINE_MS,
      id: nextId++,
    });
    connections.add(connection);
    socket.once('close', () => connections.delete(connection));
  });

  const { address, port } = await listenOn(server, options.listen, () => server.address());
  server.on('error', (error) => log({ level: 'error', msg: 'milter server error', error: error.message }));

  let closing: Promise<void> | undefined;
  const close = (): Promise<void> => {
    closing ??= new Promise<void>((resolve) => {
      const grace = setTimeout(() => {
        for (const connection of connections) connection.destroy();
      }, options.closeGraceMs ?? CLOSE_GRACE_MS);
      server.close(() => {
        clearTimeout(grace);
        resolve();
      });
      for (const connection of connections) connection.shutdown();
    });
    return closing;
  };
  return { server, address, port, close };
}
