/**
 * milter - the before-queue content filter (milter protocol 6; DESIGN decisions 2, 4 and 6).
 *
 * Listens on:   MILTER_PORT (TCP `host:port`, or a unix socket path); Postfix's smtpd_milters.
 * Decides:      at end of data: size limit, DMARC p=reject, `From:` domain opted out, sender_domains,
 *               the real size against the free quota; reserves the message in every recipient inbox;
 *               removes forged Authentication-Results with our authserv-id and inserts ours.
 * Reads/writes: reads inboxes, usage, opt-outs and DNS (DNS_SERVERS); writes reservations and records
 *               `sender_opted_out`, `sender_not_allowed` and `quota` rejections.
 * On failure:   a message it cannot decide gets a tempfail (451); if the milter is down Postfix applies
 *               `milter_default_action = tempfail`. Never a 5xx for our own trouble.
 * Security:     trusts only Postfix: listen on loopback or a private socket. Logs no message content.
 */
import type { DependencyContainer } from 'tsyringe';
import type { Config } from '../config/config.ts';
import { TOKENS } from '../container.ts';
import type { Log } from '../log.ts';
import type { MilterCheck } from '../mail/milter-check.ts';
import { startMilterServer } from '../milter/server.ts';

export async function startMilter(container: DependencyContainer, log: Log) {
  const config = container.resolve<Config>(TOKENS.Config);
  return startMilterServer({
    listen: config.milterListen,
    handler: container.resolve<MilterCheck>(TOKENS.MilterCheck),
    log,
  });
}
