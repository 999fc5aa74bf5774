/**
 * policy-target - the "ours" target of policy-bench.ts: the real policy daemon (`node src/main.ts
 * policy`, its own process) over a scratch Postgres database holding 1,000 provisioned inboxes, which
 * the load's RCPT requests name in turn (each one: inbox lookup with its usage, opt-out lookup).
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { connect } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { type Config, loadConfig } from '../../src/config/config.ts';
import { buildContainer, TOKENS } from '../../src/container.ts';
import type { InboxService } from '../../src/core/inbox-service.ts';
import type { Database } from '../../src/storage/database.ts';
import { recreateDatabase } from '../support/database.ts';
import { freePort } from '../support/sender-postfix.ts';

export interface BenchTarget {
  /** The label in the bench's table. */
  name: string;
  host: string;
  port: number;
  /** Recipient addresses to cycle through; absent: the load generator makes up `box<N>@svc.test`. */
  recipients?: string[];
  stop(): Promise<void>;
}

const ADMIN_URL = process.env.TEST_DATABASE_ADMIN_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const DB_NAME = 'inbox_policy_bench';
const INBOXES = 1000;

export async function startTarget(): Promise<BenchTarget> {
  const url = new URL(await recreateDatabase(DB_NAME, ADMIN_URL));
  const port = await freePort();
  const env = {
    ENVIRONMENT: 'dev',
    DATABASE_URL: url.toString(),
    SECRET_KEY: 'policy-bench-secret-key-0123456789abcdef',
    MAIL_DOMAIN: 'svc.test',
    POLICY_PORT: String(port),
  };
  const container = buildContainer(loadConfig(env) as Config & { secretKey: string }, { log: () => {} });
  const inboxes = container.resolve<InboxService>(TOKENS.InboxService);
  const recipients: string[] = [];
  for (let i = 0; i < INBOXES; i++) recipients.push((await inboxes.provision([])).body.address);
  await container.resolve<Database>(TOKENS.Database).close();

  const child: ChildProcess = spawn(process.execPath, ['src/main.ts', 'policy'], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'ignore', 'inherit'],
  });
  for (let i = 0; ; i++) {
    const up = await new Promise<boolean>((resolve) => {
      const socket = connect(port, '127.0.0.1', () => {
        socket.destroy();
        resolve(true);
      }).on('error', () => resolve(false));
    });
    if (up) break;
    if (i > 100) throw new Error('the policy daemon did not start');
    await sleep(100);
  }
  return {
    name: 'ours (policy daemon, Postgres)',
    host: '127.0.0.1',
    port,
    recipients,
    stop: async () => {
      child.kill('SIGTERM');
      await new Promise((resolve) => child.once('exit', resolve));
    },
  };
}
