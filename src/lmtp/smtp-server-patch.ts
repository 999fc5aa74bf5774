/**
 * smtp-server-patch - one method of an smtp-server class replaced by ours, only on the smtp-server
 * version the replacement was written against (3.21.x: each reads or calls private parts of it).
 * data-scan.ts, mail-from.ts and xforward.ts make one each; the LMTP receiver installs them at start
 * and logs what stays wrong for each one it cannot install.
 */
import { createRequire } from 'node:module';

const SUPPORTED = /^3\.21\./;

/** The smtp-server version installed. */
export function smtpServerVersion(): string {
  const require = createRequire(import.meta.url);
  return (require('smtp-server/package.json') as { version: string }).version;
}

export interface MethodPatch {
  /** The module that makes it, and what stays wrong without it (the receiver's warning). */
  readonly module: string;
  readonly without: string;
  /** Installs the replacement (idempotent). False, changing nothing, for another smtp-server version. */
  install(): boolean;
  /** Restores smtp-server's own method (tests compare the two). */
  uninstall(): void;
}

export function methodPatch<P extends object, K extends keyof P>(
  prototype: P,
  key: K,
  replacement: P[K],
  about: { module: string; without: string },
): MethodPatch {
  const original = prototype[key];
  let installed = false;
  return {
    ...about,
    install() {
      if (installed) return true;
      if (!SUPPORTED.test(smtpServerVersion()) || typeof original !== 'function') return false;
      prototype[key] = replacement;
      installed = true;
      return true;
    },
    uninstall() {
      prototype[key] = original;
      installed = false;
    },
  };
}
