/**
 * cpu-usage - CPU time spent by given processes (all their threads: V8's collector helpers included)
 * and by the whole machine, read from /proc, for the benchmarks' per-message CPU figures. Linux only.
 */
import { readFile } from 'node:fs/promises';

/** Clock ticks per second of /proc's counters (USER_HZ; 100 on Linux). */
const TICKS_PER_SECOND = 100;

export interface CpuSample {
  /** Seconds of CPU (user + system) per named process. */
  processes: Record<string, number>;
  /** Seconds of CPU the whole machine spent not idle (all cores). */
  machine: number;
}

export async function sampleCpu(pids: Record<string, number>): Promise<CpuSample> {
  const processes: Record<string, number> = {};
  for (const [name, pid] of Object.entries(pids)) {
    const stat = await readFile(`/proc/${pid}/stat`, 'utf8');
    // Fields after the command name in parentheses: utime and stime are the 12th and 13th.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    processes[name] = (Number(fields[11]) + Number(fields[12])) / TICKS_PER_SECOND;
  }
  const cpu = (await readFile('/proc/stat', 'utf8')).split('\n')[0]?.split(/\s+/).slice(1).map(Number) ?? [];
  const [user = 0, nice = 0, system = 0, , , irq = 0, softirq = 0, steal = 0] = cpu;
  return { processes, machine: (user + nice + system + irq + softirq + steal) / TICKS_PER_SECOND };
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
