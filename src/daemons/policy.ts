/**
 * policy - the Postfix policy daemon (policy delegation protocol; DESIGN decision 2 and 3).
 *
 * Listens on:   POLICY_PORT (TCP `host:port`, or a unix socket path); Postfix's check_policy_service.
 * Decides:      CONNECT: reverse DNS of the client (its own PTR query: a DNS timeout is 450, not 550).
 *               RCPT: no such inbox, cancelled, expired, envelope sender opted out, declared SIZE= over
 *               the free quota, and which recipients may share a transaction (452 4.5.3 otherwise).
 * Reads/writes: reads inboxes, usage and opt-outs; records `sender_opted_out` and `quota` rejections.
 * On failure:   logs and disconnects without a reply; Postfix retries, then answers its default action
 *               `451 4.3.5` (postfix/README.md), so an outage is a temporary failure, never a bounce.
 * Security:     trusts only Postfix: listen on loopback or a private socket.
 */
import type { DependencyContainer } from 'tsyringe';
import type { Config } from '../config/config.ts';
import { TOKENS } from '../container.ts';
import type { RecipientAdmission } from '../core/recipient-admission.ts';
import type { Log } from '../log.ts';
import { type PolicyServer, startPolicyServer } from '../policy/server.ts';

export async function startPolicy(container: DependencyContainer, log: Log): Promise<PolicyServer> {
  const config = container.resolve<Config>(TOKENS.Config);
  const admission = container.resolve<RecipientAdmission>(TOKENS.RecipientAdmission);
  return startPolicyServer({
    listen: config.policyListen,
    log,
    handler: {
      connect: () => {
        const connection = admission.connection();
        return { decide: (request) => connection.decide(request), close: () => {} };
      },
    },
  });
}
