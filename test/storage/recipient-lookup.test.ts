/**
 * The policy daemon's RCPT read (storage/recipient-lookup.ts) keeps an inbox's settings and the opt-outs
 * only while the change feed (storage/inbox-changes.ts) listens, and reads again after every change
 * PostgreSQL announces (migrations/20261129000000_inbox_change_notify.ts).
 *
 * "Kept" is shown by changing a row with triggers off (session_replication_role = replica, so nothing is
 * announced): a kept entry still answers the old value, a fresh read the new one.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { TOKENS } from '../../src/container.ts';
import type { RecipientTarget } from '../../src/core/ports.ts';
import type { Database } from '../../src/storage/database.ts';
import { InboxChangeFeed } from '../../src/storage/inbox-changes.ts';
import { PgRecipientLookup } from '../../src/storage/recipient-lookup.ts';
import { freshDatabase, type TestDatabase } from '../support/database.ts';
import { type Harness, startHarness } from '../support/harness.ts';
import { recipientAdmissionOver } from '../support/recipient-admission-over.ts';

let h: Harness;
let db: Database;
const feeds: InboxChangeFeed[] = [];
const logged: Record<string, unknown>[] = [];
before(async () => {
  h = await startHarness();
  db = h.container.resolve<Database>(TOKENS.Database);
});
after(async () => {
  for (const feed of feeds) await feed.close();
  await h.close();
});

/** A lookup that records every listening(up) its feed tells it. */
class Recording extends PgRecipientLookup {
  readonly states: boolean[] = [];
  override listening(up: boolean): void {
    this.states.push(up);
    super.listening(up);
  }
}

/** A lookup with its own feed (retrying quickly), listening. */
async function listeningLookup(): Promise<{ lookup: PgRecipientLookup; feed: InboxChangeFeed }> {
  const lookup = new PgRecipientLookup(db);
  const feed = new InboxChangeFeed(h.database.url, db, lookup, (line) => logged.push(line), { retryMs: 50 });
  feeds.push(feed);
  await feed.start();
  assert.equal(feed.listening, true);
  return { lookup, feed };
}

/** Runs SQL with triggers off: the change is not announced. */
async function unannounced(sql: string, values: unknown[]): Promise<void> {
  const client = new pg.Client({ connectionString: h.database.url });
  await client.connect();
  try {
    await client.query('SET session_replication_role = replica');
    await client.query(sql, values);
  } finally {
    await client.end();
  }
}

async function eventually(
  read: () => Promise<RecipientTarget | undefined>,
  done: (found: RecipientTarget | undefined) => boolean,
): Promise<RecipientTarget | undefined> {
  const until = Date.now() + 5000;
  for (;;) {
    const found = await read();
    if (done(found)) return found;
    if (Date.now() > until) return found;
    await sleep(5);
  }
}

const LATER = new Date('2099-01-01T00:00:00Z');

test('while the feed listens, a read is kept: an unannounced change is not seen', async () => {
  const { lookup } = await listeningLookup();
  const a = await h.provision();
  const first = await lookup.find(a.inbox_id, ['mail.sender.example', 'sender.example']);
  assert.equal(first?.inbox.inboxId, a.inbox_id);
  assert.equal(first?.inbox.cancelledAt, null);
  assert.deepEqual(first?.optedOut, []);
  await unannounced('UPDATE inboxes SET expires_at = $2 WHERE inbox_id = $1', [a.inbox_id, LATER]);
  await unannounced(`INSERT INTO sender_optouts (domain, created_at) VALUES ('sender.example', now())`, []);
  const kept = await lookup.find(a.inbox_id, ['mail.sender.example', 'sender.example']);
  assert.deepEqual(kept, first);
  // Names not asked before are read, with the inbox.
  const other = await lookup.find(a.inbox_id, ['sender.example', 'example']);
  assert.deepEqual(other?.optedOut, ['sender.example']);
  assert.deepEqual(other?.inbox.expiresAt, LATER);
});

test('each announced change is seen: cancel, extend, sender domains, purge, opt-out added and removed', async () => {
  const { lookup } = await listeningLookup();
  const [a, b, c] = [await h.provision(), await h.provision(), await h.provision()];
  const names = ['x.optout.example', 'optout.example', 'example'];
  for (const inbox of [a, b, c]) assert.ok(await lookup.find(inbox.inbox_id, names));

  await h.inboxes.cancel(a.inbox_id, h.clock.now());
  const cancelled = await eventually(
    () => lookup.find(a.inbox_id, names),
    (found) => found?.inbox.cancelledAt != null,
  );
  assert.notEqual(cancelled?.inbox.cancelledAt, null);

  const before = (await lookup.find(b.inbox_id, names))?.inbox.expiresAt.getTime() ?? 0;
  await h.inboxes.extend(
    b.inbox_id,
    3600,
    () => h.clock.now(),
    undefined,
    () => ({}),
  );
  const extended = await eventually(
    () => lookup.find(b.inbox_id, names),
    (found) => found?.inbox.expiresAt.getTime() === before + 3600_000,
  );
  assert.equal(extended?.inbox.expiresAt.getTime(), before + 3600_000);

  await h.inboxes.setSenderDomains(b.inbox_id, ['only.example'], h.clock.now());
  const listed = await eventually(
    () => lookup.find(b.inbox_id, names),
    (found) => found?.inbox.senderDomains.length === 1,
  );
  assert.deepEqual(listed?.inbox.senderDomains, ['only.example']);

  await db.rows('test-purge', 'DELETE FROM inboxes WHERE inbox_id = $1', [c.inbox_id]);
  const purged = await eventually(
    () => lookup.find(c.inbox_id, names),
    (found) => found === undefined,
  );
  assert.equal(purged, undefined);

  await h.optOuts.add('optout.example', h.clock.now());
  const optedOut = await eventually(
    () => lookup.find(b.inbox_id, names),
    (found) => (found?.optedOut.length ?? 0) > 0,
  );
  assert.deepEqual(optedOut?.optedOut, ['optout.example']);
  await h.optOuts.remove('optout.example');
  const removed = await eventually(
    () => lookup.find(b.inbox_id, names),
    (found) => found?.optedOut.length === 0,
  );
  assert.deepEqual(removed?.optedOut, []);
});

test('a message stored does not drop the entry: usage, event_seq and version are not announced', async () => {
  const { lookup } = await listeningLookup();
  const a = await h.provision();
  const first = await lookup.find(a.inbox_id, []);
  await h.deliver(a.inbox_id, 'Subject: hi\r\n\r\nbody\r\n');
  await unannounced('UPDATE inboxes SET quota_bytes = 1 WHERE inbox_id = $1', [a.inbox_id]);
  await sleep(50);
  assert.deepEqual(await lookup.find(a.inbox_id, []), first);
});

test('without a listening feed nothing is kept', async () => {
  const lookup = new PgRecipientLookup(db);
  const a = await h.provision();
  await lookup.find(a.inbox_id, ['sender.example']);
  await unannounced('UPDATE inboxes SET cancelled_at = now() WHERE inbox_id = $1', [a.inbox_id]);
  assert.notEqual((await lookup.find(a.inbox_id, ['sender.example']))?.inbox.cancelledAt, null);
});

test('a read in flight when an announcement arrives is not kept', async () => {
  const lookup = new PgRecipientLookup(db);
  lookup.listening(true);
  const a = await h.provision();
  const reading = lookup.find(a.inbox_id, []);
  lookup.changed('some-other-inbox');
  assert.equal((await reading)?.inbox.cancelledAt, null);
  await unannounced('UPDATE inboxes SET cancelled_at = now() WHERE inbox_id = $1', [a.inbox_id]);
  assert.notEqual((await lookup.find(a.inbox_id, []))?.inbox.cancelledAt, null, 'read again');
  // The same read with no announcement in flight is kept.
  const b = await h.provision();
  await lookup.find(b.inbox_id, []);
  await unannounced('UPDATE inboxes SET cancelled_at = now() WHERE inbox_id = $1', [b.inbox_id]);
  assert.equal((await lookup.find(b.inbox_id, []))?.inbox.cancelledAt, null, 'kept');
});

test('a lost feed connection drops everything, keeps nothing while down, and listens again', async () => {
  const lookup = new Recording(db);
  // The reconnect waits 1.5 s: long enough for the checks made while the feed is down to run first.
  const feed = new InboxChangeFeed(h.database.url, db, lookup, (line) => logged.push(line), {
    retryMs: 1500,
  });
  feeds.push(feed);
  await feed.start();
  const a = await h.provision();
  await lookup.find(a.inbox_id, []);
  await unannounced('UPDATE inboxes SET quota_bytes = 7 WHERE inbox_id = $1', [a.inbox_id]);
  assert.notEqual((await lookup.find(a.inbox_id, []))?.inbox.quotaBytes, 7, 'kept while listening');

  await db.rows(
    'test-kill-feed',
    `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
     WHERE datname = current_database() AND query = 'LISTEN inbox_changes'`,
    [],
  );
  const until = Date.now() + 5000;
  while (lookup.states.length < 2 && Date.now() < until) await sleep(5);
  assert.deepEqual(lookup.states, [true, false]);
  assert.equal((await lookup.find(a.inbox_id, []))?.inbox.quotaBytes, 7, 'dropped');
  await unannounced('UPDATE inboxes SET quota_bytes = 8 WHERE inbox_id = $1', [a.inbox_id]);
  assert.equal(feed.listening, false);
  assert.equal((await lookup.find(a.inbox_id, []))?.inbox.quotaBytes, 8, 'not kept');
  assert.ok(logged.some((line) => String(line.msg).startsWith('inbox change feed not listening')));

  while (lookup.states.length < 3 && Date.now() < until + 5000) await sleep(10);
  assert.deepEqual(lookup.states, [true, false, true], 'listening again');
  await lookup.find(a.inbox_id, []);
  await unannounced('UPDATE inboxes SET quota_bytes = 9 WHERE inbox_id = $1', [a.inbox_id]);
  assert.equal((await lookup.find(a.inbox_id, []))?.inbox.quotaBytes, 8, 'kept again');
});

test('a feed whose probe never comes back (announcements not reaching it) never counts as listening', async () => {
  // The pool announces in this database; the feed listens in another, as behind a proxy that hands
  // LISTEN and NOTIFY to different server connections.
  let other: TestDatabase | undefined;
  const lookup = new PgRecipientLookup(db);
  try {
    other = await freshDatabase();
    const lines: Record<string, unknown>[] = [];
    const feed = new InboxChangeFeed(other.url, db, lookup, (line) => lines.push(line), {
      retryMs: 60_000,
      probeTimeoutMs: 200,
    });
    await feed.start();
    assert.equal(feed.listening, false);
    assert.match(String(lines[0]?.error), /no announcement came back within 200 ms/);
    await feed.close();
  } finally {
    await other?.drop();
  }
  const a = await h.provision();
  await lookup.find(a.inbox_id, []);
  await unannounced('UPDATE inboxes SET quota_bytes = 9 WHERE inbox_id = $1', [a.inbox_id]);
  assert.equal((await lookup.find(a.inbox_id, []))?.inbox.quotaBytes, 9, 'nothing kept');
});

test('a listening connection that stops hearing announcements without a word is caught by the repeated probe and replaced', async () => {
  const listeners = async () =>
    new Set(
      (
        await db.rows<{ pid: number }>(
          'test-listeners',
          `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query = 'LISTEN inbox_changes'`,
          [],
        )
      ).map((row) => row.pid),
    );
  const others = await listeners();
  const lookup = new Recording(db);
  const feed = new InboxChangeFeed(h.database.url, db, lookup, (line) => logged.push(line), {
    retryMs: 100,
    probeTimeoutMs: 300,
    recheckMs: 200,
  });
  feeds.push(feed);
  await feed.start();
  const [pid] = [...(await listeners())].filter((p) => !others.has(p));
  assert.ok(pid, 'the feed has its own backend');
  const a = await h.provision();
  await lookup.find(a.inbox_id, []);

  // The backend stops (as a host gone without a reset would): the connection stays open, silent.
  process.kill(pid, 'SIGSTOP');
  try {
    const until = Date.now() + 10_000;
    while (lookup.states.length < 3 && Date.now() < until) await sleep(20);
  } finally {
    process.kill(pid, 'SIGCONT');
  }
  assert.deepEqual(lookup.states, [true, false, true], 'noticed, then listening on a new connection');
  const now = [...(await listeners())].filter((p) => !others.has(p) && p !== pid);
  assert.equal(now.length, 1, 'a new backend listens');
  await unannounced('UPDATE inboxes SET quota_bytes = 11 WHERE inbox_id = $1', [a.inbox_id]);
  assert.equal((await lookup.find(a.inbox_id, []))?.inbox.quotaBytes, 11, 'what was kept was dropped');
});

test('sync() returns once every change committed before it has been passed on: the next read sees each', async () => {
  const { lookup, feed } = await listeningLookup();
  const a = await h.provision();
  for (const quota of [1001, 1002, 1003]) {
    await lookup.find(a.inbox_id, []); // kept
    await db.rows('test-quota', 'UPDATE inboxes SET quota_bytes = $2 WHERE inbox_id = $1', [
      a.inbox_id,
      quota,
    ]);
    await feed.sync();
    assert.equal((await lookup.find(a.inbox_id, []))?.inbox.quotaBytes, quota);
  }
  await feed.close();
  await feed.sync(); // not listening: nothing is kept, nothing to wait for
});

test('the policy daemon never refuses from what it kept: an extend it was not told of reads again at RCPT', async () => {
  const { lookup } = await listeningLookup();
  const admission = recipientAdmissionOver(h, { lookup });
  const inbox = await h.provision();
  const rcpt = (instance: string) =>
    admission.connection().decide({
      protocolState: 'RCPT',
      instance,
      clientAddress: '127.0.0.3',
      reverseClientName: 'mail.sender.test',
      sender: 'news@allowed.test',
      recipient: inbox.address,
      size: 0,
    });
  assert.equal((await rcpt('1.a')).kind, 'accept');
  // Extended while the announcement is lost (the listener's connection died without a word).
  await unannounced('UPDATE inboxes SET expires_at = $2 WHERE inbox_id = $1', [inbox.inbox_id, LATER]);
  assert.equal(
    (await lookup.find(inbox.inbox_id, []))?.inbox.expiresAt.getTime() === LATER.getTime(),
    false,
    'kept',
  );
  h.clock.advance(h.config.unitSeconds + 60);
  // Past the expiry it kept: a 555 inbox expired from memory, for good; read again, the inbox is live.
  assert.equal((await rcpt('1.b')).kind, 'accept');
});
