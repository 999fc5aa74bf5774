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
 * On SIGTERM:   stops accepting; connections between transactions end at once; a transaction in
 *               progress gets its verdict (up to SHUTDOWN_GRACE_SECONDS, then it is cut and Postfix
 *               applies its tempfail default), then its connection ends.
 * Observes:     one line and one counted verdict per message, with the queue id, inbox ids, reason and
 *               decision time (metrics).
 * Security:     trusts only Postfix: listen on loopback or a private socket. Logs no message content.
 */
import type { DependencyContainer } from 'tsyringe';
import type { Config } from '../config/config.ts';
import { TOKENS } from '../container.ts';
import { inboxIdOf } from '../core/mail-address.ts';
import { replyReason, type SmtpReplies } from '../core/smtp-replies.ts';
import type { Log } from '../log.ts';
import { loadMailauth } from '../mail/mailauth-authenticator.ts';
import type { MilterCheck } from '../mail/milter-check.ts';
import type { MilterHandler } from '../milter/handler.ts';
import { startMilterServer } from '../milter/server.ts';
import type { Metrics } from '../ops/metrics.ts';

const STAGE = 'end_of_message';

export async function startMilter(container: DependencyContainer, log: Log) {
  // At start-up, not on the first message: a mailauth our line-break patch does not fit stops the milter.
  await loadMailauth();
  const config = container.resolve<Config>(TOKENS.Config);
  const check = container.resolve<MilterCheck>(TOKENS.MilterCheck);
  const metrics = container.resolve<Metrics>(TOKENS.Metrics);
  const replies = container.resolve<SmtpReplies>(TOKENS.SmtpReplies);

  const handler: MilterHandler = {
    beginMessage(envelope, headers) {
      let consumer: ReturnType<MilterCheck['beginMessage']>;
      try {
        consumer = check.beginMessage(envelope, headers);
      } catch (error) {
        metrics.verdict('milter', STAGE, 'error', 'internal');
        throw error;
      }
      const inboxIds = [
        ...new Set(envelope.recipients.flatMap((r) => inboxIdOf(r, config.mailDomain) ?? [])),
      ];
      return {
        body: (chunk) => consumer.body(chunk),
        abort: () => consumer.abort(),
        undelivered: () => consumer.undelivered(),
        end: async () => {
          const started = performance.now();
          try {
            const result = await consumer.end();
            const seconds = (performance.now() - started) / 1000;
            const { verdict } = result;
            const reason = replyReason(replies, verdict);
            metrics.milterDecision(seconds);
            metrics.verdict('milter', STAGE, verdict.kind, reason);
            log({
              msg: 'milter verdict',
              queue_id: envelope.queueId,
              inbox_ids: inboxIds,
              verdict: verdict.kind,
              reason,
              ...(verdict.kind === 'accept' ? {} : { reply: `${verdict.code} ${verdict.dsn}` }),
              ms: Math.round(seconds * 10000) / 10,
            });
            return result;
          } catch (error) {
            metrics.verdict('milter', STAGE, 'error', 'internal');
            throw error;
          }
        },
      };
    },
  };
  return startMilterServer({
    listen: config.milterListen,
    handler,
    log,
    closeGraceMs: config.shutdownGraceSeconds * 1000,
  });
}
