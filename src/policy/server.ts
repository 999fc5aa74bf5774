/**
 * server - the Postfix policy delegation listener (check_policy_service inet:HOST:PORT or unix:PATH).
 *
 * Listens on:  the given Listen (TCP, port 0 picks a free port; or a unix socket, whose stale file is
 *              removed first; a live one is left alone and listening fails with EADDRINUSE).
 * Reads:       `name=value` policy requests (codec.ts); writes one `action=` reply per request.
 * Decides:     nothing; every request goes to the handler's PolicyConnection (one per connection).
 * On failure:  bad input or a failed decision closes that connection without a reply (session.ts);
 *              Postfix retries and then applies its default_action. Other connections are unaffected.
 * close():     stops accepting, ends idle connections at once, lets each decision in progress finish
 *              and be answered for up to closeGraceMs (default CLOSE_GRACE_MS), then destroys what is
 *              left; resolves when every connection is gone.
 * Security:    anyone who can connect can ask for decisions (and so learn which inboxes exist): listen on
 *              loopback or a unix socket reachable by Postfix only.
 */

import net from 'node:net';
import type { Listen } from '../config/config.ts';
import type { Log } from '../log.ts';
import { listenOn } from '../net/listen.ts';
import type { PolicyHandler } from './handler.ts';
import { PolicySession } from './session.ts';

export const CLOSE_GRACE_MS = 5_000;

export interface PolicyServer {
  server: net.Server;
  /** `inet:host:port` with the port actually bound, or `unix:path`. */
  address: string;
  /** The bound TCP port; absent for a unix socket. */
  port?: number;
  /** Idempotent: later calls return the first call's promise. */
  close(): Promise<void>;
}

export async function startPolicyServer(options: {
  listen: Listen;
  handler: PolicyHandler;
  log: Log;
  closeGraceMs?: number;
  /** How long one decision may take before the connection is dropped without a reply. */
  decisionDeadlineMs?: number;
}): Promise<PolicyServer> {
  const { listen, handler, log } = options;
  const graceMs = options.closeGraceMs ?? CLOSE_GRACE_MS;
  const sessions = new Set<PolicySession>();
  const server = net.createServer((socket) => {
    const session = new PolicySession(socket, handler, log, options.decisionDeadlineMs);
    sessions.add(session);
    socket.once('close', () => sessions.delete(session));
  });
  server.on('error', (error) => log({ level: 'error', msg: 'policy listener error', error: error.stack }));

  const { address, port } = await listenOn(server, listen, () => server.address());

  let closing: Promise<void> | undefined;
  const close = () => {
    closing ??= new Promise<void>((resolve) => {
      server.close(() => resolve());
      for (const session of sessions) session.shutdown();
      const timer = setTimeout(() => {
        for (const session of sessions) session.destroy();
      }, graceMs);
      timer.unref();
      server.once('close', () => clearTimeout(timer));
    });
    return closing;
  };
  return port === undefined ? { server, address, close } : { server, address, port, close };
}
