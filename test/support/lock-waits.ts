/**
 * lock-waits - resolves once at least `count` sessions of the database wait for a lock. It asks on a
 * connection of its own, outside any transaction: within one, PostgreSQL answers pg_stat_activity from
 * a snapshot taken at its first read, and the count would never move.
 */
import pg from 'pg';

export async function untilWaiting(databaseUrl: string, count = 1, timeoutMs = 10_000): Promise<void> {
  const client = new pg.Client({ connectionString: databaseUrl });
  await client.connect();
  try {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const waiting = await client.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event_type = 'Lock'`,
      );
      if ((waiting.rows[0]?.n ?? 0) >= count) return;
      if (Date.now() > deadline) throw new Error(`fewer than ${count} sessions waited for a lock`);
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  } finally {
    await client.end();
  }
}
