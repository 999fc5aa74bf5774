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

  const observed = async (request: PolicyRequest, decide: () => Promise<Verdict>): Promise<Verdict> => {
    const stage = STAGES[request.protocolState] ?? 'other';
    const started = performance.now();
    let verdict: Verdict;
    try {
      verdict = await decide();
    } catch (error) {
      metrics.verdict('policy', stage, 'error', 'internal');
      throw error;
    }
    metrics.policyDecision(stage, (performance.now() - started) / 1000);
    if (stage === 'other') return verdict;
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
    return verdict;
  };

  const server = await startPolicyServer({
    listen: config.policyListen,
    log,
    closeGraceMs: config.shutdownGraceSeconds * 1000,
    handler: {
      connect: () => {
        const connection = admission.connection();
        return {
          decide: (request) => observed(request, () => connection.decide(request)),
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
