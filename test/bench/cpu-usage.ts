/**
 * cpu-usage - CPU time spent by given processes (all their threads: V8's collector helpers included)
 * and by the whole machine, read from /proc, for the benchmarks' per-message CPU figures. Linux only.
 */
import { readdir, readFile } from 'node:fs/promises';

/** Clock ticks per second of /proc's counters (USER_HZ; 100 on Linux). */
const TICKS_PER_SECOND = 100;

export interface CpuSample {
  /** Seconds of CPU (user + system) per named process. */
  processes: Record<string, number>;
  /** Seconds of CPU the whole machine spent not idle (all cores). */
  machine: number;
  /** Context switches on the whole machine since boot (/proc/stat's ctxt). */
  switches: number;
}

/** A process's CPU seconds (user + system, all threads) from its /proc/<pid>/stat line. */
function processSeconds(stat: string): number {
  // Fields after the command name in parentheses: utime and stime are the 12th and 13th.
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(fields[11]) + Number(fields[12])) / TICKS_PER_SECOND;
}

export async function sampleCpu(pids: Record<string, number>): Promise<CpuSample> {
  const processes: Record<string, number> = {};
  for (const [name, pid] of Object.entries(pids)) {
    processes[name] = processSeconds(await readFile(`/proc/${pid}/stat`, 'utf8'));
  }
  const lines = (await readFile('/proc/stat', 'utf8')).split('\n');
  const cpu = lines[0]?.split(/\s+/).slice(1).map(Number) ?? [];
  const [user = 0, nice = 0, system = 0, , , irq = 0, softirq = 0, steal = 0] = cpu;
  const switches = Number(lines.find((line) => line.startsWith('ctxt '))?.split(' ')[1] ?? 0);
  return { processes, machine: (user + nice + system + irq + softirq + steal) / TICKS_PER_SECOND, switches };
}

/** Context switches per message on the whole machine between two samples. */
export function switchesPerMessage(before: CpuSample, after: CpuSample, messages: number): number {
  return (after.switches - before.switches) / messages;
}

/** Milliseconds of CPU per message between two samples, per process and for the machine. */
export function perMessageMs(before: CpuSample, after: CpuSample, messages: number): Record<string, number> {
  const ms = (seconds: number) => (seconds * 1000) / messages;
  const result: Record<string, number> = {};
  for (const name of Object.keys(after.processes))
    result[name] = ms((after.processes[name] ?? 0) - (before.processes[name] ?? 0));
  result.machine = ms(after.machine - before.machine);
  return result;
}

/** Every live process's CPU seconds and command name (the kernel's `comm`), by pid. */
export type ProcessTable = Map<number, { command: string; seconds: number }>;

export async function sampleProcesses(): Promise<ProcessTable> {
  const table: ProcessTable = new Map();
  for (const entry of await readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    const stat = await readFile(`/proc/${entry}/stat`, 'utf8').catch(() => '');
    if (!stat) continue;
    table.set(Number(entry), {
      command: stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')')),
      seconds: processSeconds(stat),
    });
  }
  return table;
}

/**
 * Milliseconds of CPU per message by command name (postgres, smtpd, cleanup, node, ...) between two
 * samples: processes alive at the second, less what each had at the first. A process that exited in
 * between is missing, so this is for long-lived processes (Postfix reuses its daemons; the pools'
 * Postgres backends stay).
 */
export function perCommandMs(
  before: ProcessTable,
  after: ProcessTable,
  messages: number,
): Record<string, number> {
  const result: Record<string, number> = {};
  for (const [pid, now] of after) {
    const then = before.get(pid);
    const seconds = now.seconds - (then?.command === now.command ? then.seconds : 0);
    result[now.command] = (result[now.command] ?? 0) + (seconds * 1000) / messages;
  }
  return result;
}
