/**
 * cancel-race - runs a request while a cancel of its inbox holds the inbox row: the request passes its
 * credential check (the cancel is not committed yet), waits on the row lock, and the cancel commits
 * once PostgreSQL shows the request waiting for it. What the request answers then is the race's result.
 */
import pg from 'pg';
import { untilWaiting } from './lock-waits.ts';

export async function duringCancel<T>(
  databaseUrl: string,
  inboxId: string,
  cancelledAt: Date,
  request: () => Promise<T>,
): Promise<T> {
  const client = new pg.Client({ connectionString: databaseUrl });
  await client.connect();
  try {
    await client.query('BEGIN');
    // What the operator's cancel does to the inbox row (storage/inbox-store.ts cancel).
    await client.query('UPDATE inboxes SET cancelled_at = $2, version = version + 1 WHERE inbox_id = $1', [
      inboxId,
      cancelledAt,
    ]);
    const pending = request();
    await untilWaiting(databaseUrl);
    await client.query('COMMIT');
    return await pending;
  } finally {
    await client.end();
  }
}
