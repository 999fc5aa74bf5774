/**
 * mailauth-patch - puts one of our methods in place of one of mailauth's, on a class prototype inside
 * mailauth's CommonJS modules (fast-linebreaks.ts, fast-relaxed-body.ts).
 *
 * Refuses (throws, naming what is missing) when the class, the method it replaces, or a method the
 * replacement calls is not there, so a mailauth upgrade that moves or renames them fails at start-up
 * instead of silently keeping the slow path, patching the wrong thing, or failing on the first message.
 * Idempotent: every call returns mailauth's own method.
 */
import { createRequire } from 'node:module';

export interface MailauthPatch<Method> {
  /** The module, e.g. `mailauth/lib/dkim/body/relaxed.js`. */
  module: string;
  /** The exported class whose prototype is patched. */
  className: string;
  method: string;
  replacement: Method;
  /** Other methods of the prototype the replacement calls through `this`. */
  calls?: readonly string[];
  /** The file to review when the patch no longer fits. */
  by: string;
}

const require = createRequire(import.meta.url);
const originals = new Map<string, unknown>();

/** Replaces the method; returns the one mailauth had. */
export function replaceMailauthMethod<Method>(patch: MailauthPatch<Method>): Method {
  const exported = require(patch.module) as Record<string, { prototype?: Record<string, unknown> }>;
  const prototype = exported[patch.className]?.prototype;
  const needed = [patch.method, ...(patch.calls ?? [])];
  const missing = needed.filter((name) => typeof prototype?.[name] !== 'function');
  if (!prototype || missing.length > 0) {
    throw new Error(`mailauth's ${patch.className} no longer has ${missing.join(', ')}: review ${patch.by}`);
  }
  const key = `${patch.module} ${patch.className}#${patch.method}`;
  if (!originals.has(key)) originals.set(key, prototype[patch.method]);
  prototype[patch.method] = patch.replacement;
  return originals.get(key) as Method;
}
