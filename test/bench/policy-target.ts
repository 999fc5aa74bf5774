/**
 * policy-target - the "ours" target of policy-bench.ts: starts a policy daemon and says where it listens.
 *
 * PLACEHOLDER BODY. For now it runs startPolicyServer in the bench's own process with a handler that
 * answers accept after one `await`, which measures the protocol adapter alone. To measure the real
 * policy daemon, replace the body of startTarget() (e.g. migrate a database, provision inboxes, start
 * the daemon with Postgres, in-process or as a child) and keep the BenchTarget shape; return the
 * provisioned addresses in `recipients` so the load hits real inboxes. The load generator runs in its
 * own process either way.
 */
import { startPolicyServer } from '../../src/policy/server.ts';

export interface BenchTarget {
  /** The label in the bench's table. */
  name: string;
  host: string;
  port: number;
  /** Recipient addresses to cycle through; absent: the load generator makes up `box<N>@svc.test`. */
  recipients?: string[];
  stop(): Promise<void>;
}

export async function startTarget(): Promise<BenchTarget> {
  const server = await startPolicyServer({
    listen: { host: '127.0.0.1', port: 0 },
    log: () => {},
    handler: {
      connect: () => ({
        async decide() {
          await Promise.resolve(); // placeholder for the core's admission decision
          return { kind: 'accept' };
        },
        close() {},
      }),
    },
  });
  return {
    name: 'ours (placeholder: accept)',
    host: '127.0.0.1',
    port: server.port as number,
    stop: server.close,
  };
}
