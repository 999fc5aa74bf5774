/**
 * heap-flags - the V8 heap shape of the entries that move message bytes (milter, lmtp, all), applied
 * at start-up by replacing the process with itself plus the flags (`process.execve`: same pid, same
 * stdio and environment, so supervisors, Docker's PID 1 and the tests see one process).
 *
 * Why (mail-bench, 1 MiB messages, CPU per message): with V8's defaults the receiver ran a full
 * mark-compact every 50-80 ms and the milter one every few hundred: their live heap is small (about
 * 20 MB), so the old generation's limit after a collection sits some 24 MB above it, and every MiB of
 * mail brings a MiB of socket Buffers, which a 16 MB semi-space promotes; concurrent marking was
 * about 45% of both daemons' CPU. `--initial-old-space-size=128` moves the first limit away from the
 * start-up heap, `--max-semi-space-size=8` keeps the young generation small enough that V8 does not
 * count the remaining room as already used. Measured (mail-bench, ours alone, 600 messages of 1 MiB):
 * receiver 8.8-9.2 -> 4.9-5.3 ms, milter 5-6 -> 2.9-3.4 ms per message, the receiver's mark-compacts
 * from one per 50-80 ms to its pacer's few; 10 KiB messages: receiver 1.0 -> 0.8 ms. Only the old
 * generation's *first* limit moves: V8 still collects when the heap really grows.
 *
 * With collections this rare, the receiver's garbage socket Buffers are left to its buffer pacer
 * (src/lmtp/buffer-pacer.ts), which frees them mostly with young-generation collections.
 *
 * A flag the operator already gives on the command line (or, for --max-semi-space-size, in
 * NODE_OPTIONS, which does not accept --initial-old-space-size) is left as given; HEAP_FLAGS=off in
 * the environment turns all of this off. HEAP_FLAGS_APPLIED in the new process's environment makes
 * sure it happens once.
 */
import { accessSync, constants } from 'node:fs';

/** Extra V8 flags per entry of src/main.ts; entries not listed run with V8's defaults. */
const BYTE_MOVERS = ['--initial-old-space-size=128', '--max-semi-space-size=8'];
export const HEAP_FLAGS: Readonly<Record<string, readonly string[]>> = {
  milter: BYTE_MOVERS,
  lmtp: BYTE_MOVERS,
  all: BYTE_MOVERS,
};

const APPLIED = 'HEAP_FLAGS_APPLIED';

/** `--no-foo_bar=1` -> `foo-bar`: a flag given either way, in either spelling, is the operator's. */
const flagName = (flag: string) => (flag.split('=')[0] ?? flag).replaceAll('_', '-').replace(/^--(no-)?/, '');

/** The flags of `entry` that neither `execArgv` nor `nodeOptions` already sets (to any value). */
export function missingHeapFlags(entry: string, execArgv: readonly string[], nodeOptions = ''): string[] {
  const flags = Object.hasOwn(HEAP_FLAGS, entry) ? (HEAP_FLAGS[entry] ?? []) : [];
  const given = new Set([...execArgv, ...nodeOptions.split(/\s+/)].filter(Boolean).map(flagName));
  return flags.filter((flag) => !given.has(flagName(flag)));
}

/**
 * Replaces the process with itself plus the missing flags of `entry`. Returns, running with V8's
 * defaults (slower, correct), when there are none, when it already did (HEAP_FLAGS_APPLIED), when
 * `enabled` is false (HEAP_FLAGS=off), where `process.execve` is missing (not on Linux or macOS), or
 * when the node binary cannot be executed. Node aborts the process (exit 134) if execve itself fails,
 * so the binary is checked first.
 */
export function applyHeapFlags(entry: string, enabled: boolean): void {
  if (!enabled || process.env[APPLIED]) return;
  const missing = missingHeapFlags(entry, process.execArgv, process.env.NODE_OPTIONS);
  if (missing.length === 0 || typeof process.execve !== 'function') return;
  try {
    accessSync(process.execPath, constants.X_OK);
  } catch (error) {
    process.stderr.write(`heap flags not applied (${String(error)}); running with V8's defaults\n`);
    return;
  }
  process.execve(
    process.execPath,
    [process.execPath, ...missing, ...process.execArgv, ...process.argv.slice(1)],
    { ...process.env, [APPLIED]: missing.join(' ') },
  );
}
