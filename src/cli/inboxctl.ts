#!/usr/bin/env node
/**
 * inboxctl - the operator's command line: migrate the database, provision an inbox while provisioning
 * is closed, cancel an inbox for abuse, and keep the registry of opted-out sender domains.
 *
 * Run as `npx --no-install inboxctl ...` (or `npm run inboxctl -- ...`) from the repository root;
 * `--help` lists the commands. It listens on nothing. It reads the service's environment (DATABASE_URL,
 * SECRET_KEY, ...) and its database, through the same core services as the API (run-command.ts).
 *
 * Output: results on stdout, diagnostics on stderr. Exit status (sysexits): 0 done; 1 the command
 * failed (unknown inbox, opted-out domain, database unreachable); 64 bad arguments; 78 bad
 * configuration. Arguments are checked before the configuration is read or anything is connected to,
 * and before the service's modules are even loaded, so a typo costs nothing.
 *
 * Security: `inbox create` prints both credentials of the new inbox; they are shown once and never
 * again, so its output is as sensitive as the credentials. Cancellation acts on an inbox id from the
 * reporter's evidence and never reads the inbox's mail (contract section 3).
 */
import { parseCommand, USAGE, UsageError } from './parse-command.ts';

async function main(argv: string[]): Promise<number> {
  let command: ReturnType<typeof parseCommand>;
  try {
    command = parseCommand(argv);
  } catch (error) {
    if (!(error instanceof UsageError)) throw error;
    process.stderr.write(
      argv.length === 0 ? USAGE : `inboxctl: ${error.message}\nrun "inboxctl --help" for usage\n`,
    );
    return 64;
  }
  if (command.kind === 'help') {
    process.stdout.write(USAGE);
    return 0;
  }
  const { runCommand } = await import('./run-command.ts');
  return runCommand(command);
}

main(process.argv.slice(2)).then(
  (status) => {
    process.exitCode = status;
  },
  (error: unknown) => {
    process.stderr.write(
      `inboxctl: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`,
    );
    process.exitCode = 1;
  },
);
