/**
 * run-cli - runs a one-shot command's main and exits with its status: a ConfigError is
 * `configuration error: ...` and 78 (EX_CONFIG), any other failure `<name>: <stack>` and 1.
 */
import { ConfigError } from '../config/config.ts';

export function runCli(name: string, main: () => Promise<number>): void {
  main().then(
    (code) => process.exit(code),
    (error: unknown) => {
      if (error instanceof ConfigError) {
        process.stderr.write(`configuration error: ${error.message}\n`);
        process.exit(78);
      }
      process.stderr.write(`${name}: ${error instanceof Error ? error.stack : String(error)}\n`);
      process.exit(1);
    },
  );
}
