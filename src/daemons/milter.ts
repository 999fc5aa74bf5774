/**
 * milter - the before-queue content filter (milter protocol 6; DESIGN decisions 2, 4 and 6).
 *
 * Listens on:   MILTER_PORT (TCP `host:port`, or a unix socket path); Postfix's smtpd_milters.
 * Decides:      at end of data: size limit, DMARC p=reject, `From:` domain opted out, sender_domains,
 *               the real size against the free quota; reserves the message in every recipient inbox;
 *               removes forged Authentication-Results with our authserv-id and inserts ours.
 * Reads/writes: reads inboxes, usage, opt-outs and DNS (DNS_SERVERS); writes reservations and records
 *               `sender_opted_out`, `sender_not_allowed` and `quota` rejections; every second its
 *               heartbeat, and every 5 s releases what a milter silent for a minute reserved and never
 *               answered (mail/orphan-sweep.ts).
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
import type { ReservationLedger } from '../core/reservation-ledger.ts';
import { replyReason, type SmtpReplies } from '../core/smtp-replies.ts';
import type { Verdict } from '../core/verdict.ts';
import type { Log } from '../log.ts';
import { loadMailauth } from '../mail/mailauth-authenticator.ts';
import type { MilterCheck } from '../mail/milter-check.ts';
import { startOrphanSweep } from '../mail/orphan-sweep.ts';
import type { MilterHandler } from '../milter/handler.ts';
import { startMilterServer } from '../milter/server.ts';
import { HEADER_FIELD_TOO_LARGE, HEADERS_TOO_LARGE } from '../milter/session.ts';
import type { Metrics } from '../ops/metrics.ts';
import type { PgMilterIncarnations } from '../storage/milter-incarnations.ts';

const STAGE = 'end_of_message';

export async function startMilter(container: DependencyContainer, log: Log) {
  // At start-up, not on the first message: a mailauth our line-break patch does not fit stops the milter.
  await loadMailauth();
  const config = container.resolve<Config>(TOKENS.Config);
  const check = container.resolve<MilterCheck>(TOKENS.MilterCheck);
  const metrics = container.resolve<Metrics>(TOKENS.Metrics);
  const replies = container.resolve<SmtpReplies>(TOKENS.SmtpReplies);

  // When end() began, by queue id, for the log line's time to the answer. answered() always follows an
  // end() (the session answers every message it asked to end) and takes the entry out.
  const endedAt = new Map<string, number>();
  const handler: MilterHandler = {
    beginMessage(envelope, headers) {
      const consumer = check.beginMessage(envelope, headers);
      return {
        body: (chunk) => consumer.body(chunk),
        abort: () => consumer.abort(),
        delivered: () => consumer.delivered?.(),
        undelivered: () => consumer.undelivered(),
        end: async () => {
          const started = performance.now();
          if (envelope.queueId) endedAt.set(envelope.queueId, started);
          try {
            return await consumer.end();
          } finally {
            metrics.milterDecision((performance.now() - started) / 1000);
          }
        },
      };
    },
    // Counted and logged as sent: a verdict that came past its deadline was a `t` to Postfix.
    answered(message, answer) {
      const verdict = answer === 'tempfail' ? null : answer;
      const kind = verdict?.kind ?? 'error';
      const reason = verdict ? milterReason(verdict) : 'internal';
      metrics.verdict('milter', STAGE, kind, reason);
      const began = endedAt.get(message.queueId);
      endedAt.delete(message.queueId);
      const ms = began === undefined ? undefined : performance.now() - began;
      log({
        ...(kind === 'error' ? { level: 'warn' as const } : {}),
        msg: 'milter verdict',
        queue_id: message.queueId,
        inbox_ids: [...new Set(message.recipients.flatMap((r) => inboxIdOf(r, config.mailDomain) ?? []))],
        verdict: kind,
        reason,
        ...(verdict && verdict.kind !== 'accept' ? { reply: `${verdict.code} ${verdict.dsn}` } : {}),
        ...(kind === 'error' ? { reply: '451 4.7.1' } : {}),
        ...(ms === undefined ? {} : { ms: Math.round(ms * 10) / 10 }),
      });
    },
  };
  /** The milter's own refusals of a header too large are no reply of SmtpReplies. */
  const milterReason = (verdict: Verdict) =>
    verdict === HEADERS_TOO_LARGE || verdict === HEADER_FIELD_TOO_LARGE
      ? 'header_too_large'
      : replyReason(replies, verdict);
  // Reservations name this process once its heartbeat row is written (mail/orphan-sweep.ts).
  const sweep = startOrphanSweep(
    container.resolve<ReservationLedger>(TOKENS.ReservationLedger),
    container.resolve<PgMilterIncarnations>(TOKENS.MilterIncarnations),
    log,
    undefined,
    (count) => metrics.orphansReleased(count),
  );
  const server = await startMilterServer({
    listen: config.milterListen,
    handler,
    log,
    closeGraceMs: config.shutdownGraceSeconds * 1000,
  });
  return {
    ...server,
    // After the last answer: the heartbeat row goes, or says what is still open (orphan-sweep.ts).
    close: async () => {
      await server.close();
      await sweep.stop();
    },
  };
}
