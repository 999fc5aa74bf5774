/**
 * lmtp - the LMTP receiver Postfix delivers accepted mail to (RFC 2033; DESIGN decisions 1, 5 and 7).
 *
 * Listens on:   LMTP_PORT (TCP `host:port`, or a unix socket path); Postfix's virtual_transport.
 * Reads/writes: streams each message into Postgres chunk by chunk, turning the milter's reservation into
 *               a stored message; idempotent on (Postfix queue id, inbox) via XFORWARD IDENT.
 * Replies:      one per recipient: 250 once committed, 4xx on any trouble. Never a 5xx: mail Postfix has
 *               queued must not bounce (no backscatter); an address that is no inbox is answered 250 and
 *               dropped, with a log line.
 * On failure:   the database being down answers 451 and Postfix retries later; nothing is lost.
 * On SIGTERM:   stops accepting; every further command is answered 421; a delivery in progress
 *               finishes and is answered for up to SHUTDOWN_GRACE_SECONDS, then 421 (a 4xx: Postfix
 *               keeps the message and retries) and its store rolls back.
 * Observes:     one log line and one metrics report per delivery: queue id, inbox ids, outcomes, bytes,
 *               time.
 * Security:     anyone who can connect can store mail: listen on loopback or a private socket.
 */
import type { DependencyContainer } from 'tsyringe';
import type { Config } from '../config/config.ts';
import { TOKENS } from '../container.ts';
import type { DeliveryService } from '../core/delivery-service.ts';
import { type LmtpServer, startLmtpServer } from '../lmtp/server.ts';
import type { Log } from '../log.ts';

export async function startLmtp(container: DependencyContainer, log: Log): Promise<LmtpServer> {
  const config = container.resolve<Config>(TOKENS.Config);
  const delivery = container.resolve<DeliveryService>(TOKENS.DeliveryService);
  return startLmtpServer({
    listen: config.lmtpListen,
    handler: { deliver: (envelope, message) => delivery.deliver(envelope, message) },
    log,
    hostname: config.authservId,
    maxMessageBytes: config.maxMessageBytes,
    closeGraceMs: config.shutdownGraceSeconds * 1000,
  });
}
