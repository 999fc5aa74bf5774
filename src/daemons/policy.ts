/**
 * policy - the Postfix policy daemon (policy delegation protocol; DESIGN decision 2 and 3).
 *
 * Listens on:   POLICY_PORT (TCP `host:port`, or a unix socket path); Postfix's check_policy_service.
 * Decides:      CONNECT: reverse DNS of the client (its own PTR query: a DNS timeout is 450, not 550).
 *               RCPT: no such inbox, cancelled, expired, envelope sender opted out, declared SIZE= over
 *               the free quota, and which recipients may share a transaction (452 4.5.3 otherwise).
 * Reads/writes: reads inboxes, usage and opt-outs; records `sender_opted_out` and `quota` rejections.
 *               Keeps what RCPT reads of an inbox (not its usage) while a second connection LISTENs for
 *               changes (storage/inbox-changes.ts, storage/recipient-lookup.ts).
 * On failure:   logs and disconnects without a reply; Postfix retries, then answers its default action
 *               `451 4.3.5` (postfix/README.md), so an outage is a temporary failure, never a bounce.
 * On SIGTERM:   stops accepting; idle connections end at once; a decision in progress is answered, then
 *               its connection ends (up to SHUTDOWN_GRACE_SECONDS). Postfix opens a new connection to
 *               another policy daemon, or applies its default action, for what comes next.
 * Observes:     every CONNECT and RCPT verdict and its latency (metrics); a line per refusal, with the
 *               inbox id and client address (never the message, which has not been sent yet).
 * Security:     trusts only Postfix: listen on loopback or a private socket.
 */
import type { DependencyContainer } from 'tsyringe';
import type { Config } from '../config/config.ts';
import { TOKENS } from '../container.ts';
import { inboxIdOf } from '../core/mail-address.ts';
import type { RecipientAdmission } from '../core/recipient-admission.ts';
import { replyReason, type SmtpReplies } from '../core/smtp-replies.ts';
import type { Verdict } from '../core/verdict.ts';
import type { Log } from '../log.ts';
import type { Metrics } from '../ops/metrics.ts';
import type { PolicyRequest } from '../policy/handler.ts';
import { type PolicyServer, startPolicyServer } from '../policy/server.ts';
import type { InboxChangeFeed } from '../storage/inbox-changes.ts';

/** The stages Postfix asks us about (postfix/main.cf); any other is answered DUNNO and counted as `other`. */
const STAGES: Record<string, string> = { CONNECT: 'connect', RCPT: 'rcpt' };

export async function startPolicy(container: DependencyContainer, log: Log): Promise<PolicyServer> {
  const config = container.resolve<Config>(TOKENS.Config);
  const admission = container.resolve<RecipientAdmission>(TOKENS.RecipientAdmission);
  const metrics = container.resolve<Metrics>(TOKENS.Metrics);
  const replies = container.resolve<SmtpReplies>(TOKENS.SmtpReplies);
  // What RCPT reads of an inbox is kept between requests while this feed listens (storage/recipient-lookup.ts).
  const changes = container.resolve<InboxChangeFeed>(TOKENS.InboxChangeFeed);
  await changes.start();

  // Decision time only: what Postfix got is counted and logged by `answered`.
  const timed = async (request: PolicyRequest, decide: () => Promise<Verdict>): Promise<Verdict> => {
    const started = performance.now();
    try {
      return await decide();
    } finally {
      metrics.policyDecision(STAGES[request.protocolState] ?? 'other', (performance.now() - started) / 1000);
    }
  };
  // Counted and logged as answered: a verdict past the session's deadline never reached Postfix. A
  // request with no reply is an `error` each time; Postfix asks twice (smtpd_policy_service_try_limit).
  const answered = (request: PolicyRequest, verdict: Verdict | null): void => {
    const stage = STAGES[request.protocolState] ?? 'other';
    if (verdict === null) {
      metrics.verdict('policy', stage, 'error', 'internal');
      return;
    }
    if (stage === 'other') return;
    const reason = replyReason(replies, verdict);
    metrics.verdict('policy', stage, verdict.kind, reason);
    if (verdict.kind !== 'accept') {
      const inboxId = stage === 'rcpt' ? inboxIdOf(request.recipient, config.mailDomain) : null;
      log({
        msg: 'policy refusal',
        stage,
        reason,
        reply: `${verdict.code} ${verdict.dsn}`,
        ...(inboxId ? { inbox_id: inboxId } : {}),
        client_address: request.clientAddress,
        ...(request.queueId ? { queue_id: request.queueId } : {}),
      });
    }
  };

  const server = await startPolicyServer({
    listen: config.policyListen,
    log,
    closeGraceMs: config.shutdownGraceSeconds * 1000,
    handler: {
      connect: () => {
        const connection = admission.connection();
        return {
          decide: (request) => timed(request, () => connection.decide(request)),
          answered,
          close: () => {},
        };
      },
    },
  }).catch(async (error: unknown) => {
    await changes.close();
    throw error;
  });
  let closing: Promise<void> | undefined;
  const close = () => {
    closing ??= server.close().finally(() => changes.close());
    return closing;
  };
  return { ...server, close };
}
