/**
 * chaos - the faults the crash soak injects, one at a time, at random moments, while mail flows:
 *
 *   kill <daemon>     SIGKILL of the policy daemon, the milter or the LMTP receiver, started again
 *                     0-1.5 s later (a crash, the OOM killer, `docker kill`)
 *   freeze <daemon>   SIGSTOP for 0.5-3 s, then SIGCONT (a paused VM, a long collection)
 *   drop connections  every session of the soak's database ended by the server (a failover, a
 *                     restarted PostgreSQL): transactions in progress fail
 *   database away     the database refuses connections for 1-4 s, and its sessions are ended
 *   freeze database   every backend of the database SIGSTOPped for 1-4 s (a storage stall)
 *   crash database    one backend of the database SIGKILLed: the postmaster ends every session of
 *                     the cluster and runs crash recovery (what a PostgreSQL crash does); commits
 *                     acknowledged before it must all be there after
 *
 * Every fault is one the contract must survive without losing or bouncing a message: each leaves the
 * mail it hit to a temporary failure that the sending MTA retries.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type pg from 'pg';
import { asAdmin } from '../support/database.ts';
import {
  allowConnections as allowConnectionsOf,
  endSessions as endSessionsOf,
  sessionPids,
} from '../support/database-outage.ts';
import type { Daemon } from './daemons.ts';

export interface Chaos {
  /** Faults injected so far, by kind. */
  readonly counts: Map<string, number>;
  /** Ends the loop after the fault in progress, and leaves every daemon running and the database open. */
  stop(): Promise<void>;
}

export function startChaos(options: {
  daemons: Daemon[];
  adminUrl: string;
  database: string;
  random: () => number;
  /** Between faults: a random wait in this range, in ms. */
  gapMs: [number, number];
  /** Only these kinds (e.g. `kill milter`), or every kind when empty. */
  only?: string[];
  log: (line: string) => void;
}): Chaos {
  const { daemons, random, log } = options;
  const between = (low: number, high: number) => Math.round(low + random() * (high - low));
  const counts = new Map<string, number>();
  let stopped = false;

  const admin = <T>(work: (client: pg.Client) => Promise<T>) => asAdmin(work, options.adminUrl);
  /** After a crash the cluster restarts (about a second): wait until it takes connections again. */
  const waitForDatabase = async () => {
    for (let tries = 0; ; tries++) {
      await sleep(250);
      try {
        await admin((client) => client.query('SELECT 1'));
        return;
      } catch (error) {
        if (tries > 240) throw error;
      }
    }
  };
  const endSessions = (client: pg.Client) => endSessionsOf(client, options.database);
  const backends = (client: pg.Client) => sessionPids(client, options.database);
  const signal = (pids: number[], name: NodeJS.Signals) => {
    for (const pid of pids) {
      try {
        process.kill(pid, name);
      } catch {
        // gone meanwhile
      }
    }
  };
  const allowConnections = (client: pg.Client, allow: boolean) =>
    allowConnectionsOf(client, options.database, allow);

  const every: { kind: string; run(): Promise<void> }[] = [
    ...daemons.map((daemon) => ({
      kind: `kill ${daemon.name}`,
      async run() {
        await daemon.kill();
        await sleep(between(0, 1500));
        await daemon.start();
      },
    })),
    ...daemons.map((daemon) => ({
      kind: `freeze ${daemon.name}`,
      run: () => daemon.freeze(between(500, 3000)),
    })),
    { kind: 'drop connections', run: () => admin(endSessions).then(() => undefined) },
    {
      kind: 'database away',
      run: () =>
        admin(async (client) => {
          await allowConnections(client, false);
          try {
            await endSessions(client);
            await sleep(between(1000, 4000));
          } finally {
            await allowConnections(client, true);
          }
        }),
    },
    {
      kind: 'freeze database',
      run: () =>
        admin(async (client) => {
          const pids = await backends(client);
          signal(pids, 'SIGSTOP');
          try {
            await sleep(between(1000, 4000));
          } finally {
            signal(pids, 'SIGCONT');
          }
        }),
    },
    {
      kind: 'crash database',
      async run() {
        const pids = await admin(backends);
        const victim = pids[Math.floor(random() * pids.length)];
        if (victim !== undefined) signal([victim], 'SIGKILL');
        await waitForDatabase();
      },
    },
  ];

  const faults = every.filter((fault) => !options.only?.length || options.only.includes(fault.kind));
  if (faults.length === 0) throw new Error(`no fault of kinds ${options.only?.join(', ')}`);

  const loop = (async () => {
    while (!stopped) {
      await sleep(between(...options.gapMs));
      if (stopped) break;
      const fault = faults[Math.floor(random() * faults.length)] as (typeof faults)[number];
      const started = performance.now();
      try {
        await fault.run();
        counts.set(fault.kind, (counts.get(fault.kind) ?? 0) + 1);
        log(`fault: ${fault.kind} (${Math.round(performance.now() - started)} ms)`);
      } catch (error) {
        log(`fault ${fault.kind} failed: ${error instanceof Error ? error.message : String(error)}`);
        throw error;
      }
    }
  })();
  // A fault that failed ends the loop; stop() reports it.
  loop.catch(() => {});

  return {
    counts,
    async stop() {
      stopped = true;
      await loop;
      await admin((client) => allowConnections(client, true));
      for (const daemon of daemons) await daemon.start();
    },
  };
}
