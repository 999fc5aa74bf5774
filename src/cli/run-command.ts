/**
 * run-command - carries out one parsed inboxctl command against the service's database and returns
 * the exit status (sysexits: 0 done, 1 failed, 78 bad configuration).
 *
 * It reads the service's environment exactly as the daemons do (loadConfig, then ensureSecretKey) and
 * goes through the container's core services and store ports, never raw SQL, so an inbox made here is
 * the same as one POST /v1/inboxes makes. Results go to stdout, diagnostics to stderr, one line each.
 * The pool is closed before returning, so the process exits as soon as the command is done.
 */
import type { DependencyContainer } from 'tsyringe';
import { ConfigError, loadConfig } from '../config/config.ts';
import { ensureSecretKey } from '../config/secret-key.ts';
import { buildContainer, TOKENS } from '../container.ts';
import type { Clock } from '../core/clock.ts';
import { ServiceError } from '../core/errors.ts';
import type { InboxService } from '../core/inbox-service.ts';
import type { OptOutStore } from '../core/ports.ts';
import { createLog } from '../log.ts';
import type { Database } from '../storage/database.ts';
import { migrate } from '../storage/migrate.ts';
import type { Command } from './parse-command.ts';

export type RunnableCommand = Exclude<Command, { kind: 'help' }>;

/** An expected failure of a command (unknown inbox, opted-out domain): one line, exit status 1. */
class Failure extends Error {}

const out = (text: string) => process.stdout.write(`${text}\n`);
const fail = (text: string) => process.stderr.write(`inboxctl: ${text}\n`);

export async function runCommand(command: RunnableCommand): Promise<number> {
  try {
    const config = await ensureSecretKey(loadConfig());
    if (command.kind === 'migrate') {
      const applied = await migrate(config.databaseUrl);
      for (const name of applied) out(`applied ${name}`);
      out(applied.length === 0 ? 'database is up to date' : `applied ${applied.length} migration(s)`);
      return 0;
    }
    const container = buildContainer(config, {
      log: createLog('inboxctl', (text) => process.stderr.write(text)),
      poolSize: 2,
    });
    try {
      await execute(command, container);
    } finally {
      await container.resolve<Database>(TOKENS.Database).close();
    }
    return 0;
  } catch (error) {
    if (error instanceof ConfigError) {
      process.stderr.write(`configuration error: ${error.message}\n`);
      return 78;
    }
    fail(describe(error));
    return 1;
  }
}

async function execute(command: Exclude<RunnableCommand, { kind: 'migrate' }>, c: DependencyContainer) {
  const inboxes = () => c.resolve<InboxService>(TOKENS.InboxService);
  const optOuts = () => c.resolve<OptOutStore>(TOKENS.OptOutStore);
  const now = () => c.resolve<Clock>(TOKENS.Clock).now();
  switch (command.kind) {
    case 'inbox-create': {
      // Provisioning's open/closed switch is the HTTP route's check; the operator provisions regardless.
      const { body } = await inboxes()
        .provision(command.senderDomains)
        .catch((error: unknown) => {
          if (!(error instanceof ServiceError) || error.code !== 'sender_opted_out') throw error;
          const domains = (error.details?.domains as string[] | undefined) ?? [];
          throw new Failure(`refused: sender domains opted out: ${domains.join(', ')}; no inbox was created`);
        });
      out(JSON.stringify(body, null, 2));
      return;
    }
    case 'inbox-cancel':
      switch (await inboxes().cancel(command.inboxId)) {
        case 'not_found':
          throw new Failure(`no such inbox: ${command.inboxId}`);
        case 'expired':
          throw new Failure(`inbox ${command.inboxId} has expired: nothing to cancel`);
        case 'already_cancelled':
          out(`inbox ${command.inboxId} was already cancelled`);
          return;
      }
      out(`cancelled inbox ${command.inboxId}`);
      return;
    case 'optout-add':
      out(
        (await optOuts().add(command.domain, now()))
          ? `opted out ${command.domain}`
          : `${command.domain} was already opted out`,
      );
      return;
    case 'optout-remove':
      if (!(await optOuts().remove(command.domain))) throw new Failure(`${command.domain} is not opted out`);
      out(`removed the opt-out of ${command.domain}`);
      return;
    case 'optout-list': {
      const list = await optOuts().list();
      if (command.json) {
        out(JSON.stringify(list.map((o) => ({ domain: o.domain, created_at: o.createdAt.toISOString() }))));
      } else {
        for (const { domain } of list) out(domain);
      }
      return;
    }
  }
}

/** One line for an error, including pg's and the dual-stack connect AggregateError whose message is empty. */
function describe(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  const { code } = error as { code?: string };
  if (code === '42P01') return `${error.message} (is the database migrated? run "inboxctl migrate")`;
  if (error.message !== '') return error.message;
  if (error instanceof AggregateError && error.errors.length > 0) return describe(error.errors[0]);
  return code ?? error.name;
}
