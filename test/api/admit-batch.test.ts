/**
 * The gatekeeper's batching (storage/admit-batch.ts) on the real Postgres: requests that arrive
 * together share one statement yet each gets the answer it would get alone; first requests and
 * refusals fall back to the one-request statement; batches in two "processes" (two pools) taking
 * tokens of the same inboxes in opposite orders neither deadlock nor lose a token.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { TOKENS } from '../../src/container.ts';
import type { ProvisionedInbox } from '../../src/core/inbox-service.ts';
import type { Admission, AdmissionRequest } from '../../src/core/ports.ts';
import { hashCredential } from '../../src/core/secrets.ts';
import { ADMIT_BATCH_SQL } from '../../src/storage/admit-sql.ts';
import { Database } from '../../src/storage/database.ts';
import { PgGatekeeper } from '../../src/storage/gatekeeper.ts';
import { type Harness, startHarness } from '../support/harness.ts';

let h: Harness;
const databases: Database[] = [];

before(async () => {
  h = await startHarness();
});
after(async () => {
  await Promise.all(databases.map((db) => db.close()));
  await h.close();
});

/** A gatekeeper on its own pool (as another API process would have), counting its statements by name. */
function gatekeeper(burst: number, perSecond = 1) {
  const db = new Database(h.config.databaseUrl, 4);
  databases.push(db);
  const statements: string[] = [];
  const rows = db.rows.bind(db);
  db.rows = (name, text, values, on) => {
    statements.push(name);
    return rows(name, text, values, on);
  };
  const settings = { burst, perSecond };
  return { gate: new PgGatekeeper(db, { poll: settings, download: settings }), statements, db };
}

function request(
  inbox: ProvisionedInbox,
  token: string,
  over: Partial<AdmissionRequest> = {},
): AdmissionRequest {
  const now = h.clock.now();
  return {
    credentialHash: hashCredential(token),
    inboxId: inbox.inbox_id,
    ownerOnly: false,
    bucket: 'poll',
    take: true,
    withUsage: false,
    knownUsageVersion: null,
    now,
    purgeCutoff: new Date(now.getTime() - h.config.purgeAfterSeconds * 1000),
    ...over,
  };
}

const outcome = (a: Admission | undefined) => (a ? `${a.inbox.inboxId} ${a.role} ${a.bucket}` : 'unknown');

test('requests that arrive together share one statement, and each gets the answer it would get alone', async () => {
  const { gate, statements } = gatekeeper(3);
  const [a, b] = [await h.provision(), await h.provision()];
  // Each inbox's first request creates its bucket (the one-request statement).
  await gate.admit(request(a, a.credentials.reader));
  await gate.admit(request(b, b.credentials.owner));
  statements.length = 0;

  const results = await Promise.all([
    gate.admit(request(a, a.credentials.reader)),
    gate.admit(request(b, b.credentials.owner, { ownerOnly: true })),
    gate.admit(request(b, a.credentials.reader)), // a's credential on b's path: foreign
    gate.admit(request(a, 'rmr_unknown0000000000000000000000000')),
    gate.admit(request(a, a.credentials.reader, { ownerOnly: true })), // reader on an owner-only call
    gate.admit(request(a, a.credentials.owner, { take: false })), // malformed: takes nothing
    gate.admit(request(b, b.credentials.reader, { withUsage: true })),
  ]);
  assert.deepEqual(results.map(outcome), [
    `${a.inbox_id} reader taken`,
    `${b.inbox_id} owner taken`,
    `${a.inbox_id} reader skipped`,
    'unknown',
    `${a.inbox_id} reader skipped`,
    `${a.inbox_id} owner skipped`,
    `${b.inbox_id} reader taken`,
  ]);
  assert.deepEqual(results[6]?.usage, { messageCount: 0, quotaUsedBytes: 0, changesAt: null });
  assert.equal(results[0]?.usage, undefined, 'usage only when asked for');
  // Requests for the same inbox and bucket never share a statement: seven requests, three batches.
  assert.ok(statements.length > 0 && statements.length <= 3, statements.join(', '));
  assert.ok(
    statements.every((name) => name === 'admit-batch'),
    statements.join(', '),
  );

  // a has spent two tokens of its burst of 3, b all three: of two more for a one is taken, b is refused.
  const [a1, a2, b1] = await Promise.all([
    gate.admit(request(a, a.credentials.reader)),
    gate.admit(request(a, a.credentials.owner)),
    gate.admit(request(b, b.credentials.reader)),
  ]);
  assert.deepEqual([a1?.bucket, a2?.bucket].sort(), ['refused', 'taken']);
  assert.equal(b1?.bucket, 'refused');
  assert.deepEqual(
    [a1, a2, b1].filter((r) => r?.bucket === 'refused').map((r) => r?.retryAfterSeconds),
    [1, 1],
  );
});

test("an inbox's first requests, arriving together, create its bucket and take a token each", async () => {
  const { gate } = gatekeeper(2);
  const inboxes = await Promise.all(Array.from({ length: 4 }, () => h.provision()));
  const first = await Promise.all(inboxes.map((i) => gate.admit(request(i, i.credentials.reader))));
  assert.deepEqual(
    first.map((r) => r?.bucket),
    ['taken', 'taken', 'taken', 'taken'],
  );
  const second = await Promise.all(inboxes.map((i) => gate.admit(request(i, i.credentials.owner))));
  assert.deepEqual(
    second.map((r) => r?.bucket),
    ['taken', 'taken', 'taken', 'taken'],
  );
  const third = await Promise.all(inboxes.map((i) => gate.admit(request(i, i.credentials.owner))));
  assert.deepEqual(
    third.map((r) => r?.bucket),
    ['refused', 'refused', 'refused', 'refused'],
  );
});

test('two processes batching the same inboxes in opposite orders neither deadlock nor lose a token', async () => {
  const perSecond = 1000;
  const one = gatekeeper(1_000_000, perSecond);
  const two = gatekeeper(1_000_000, perSecond);
  const inboxes = await Promise.all(Array.from({ length: 12 }, () => h.provision()));
  const db = h.container.resolve<Database>(TOKENS.Database);
  // Buckets of many other inboxes, as in production: the planner then reaches each bucket through the
  // index, in the order of the batch's requests (on a near-empty table it scans it whole, in one order).
  await db.pool.query(`INSERT INTO rate_buckets (inbox_id, bucket, tat)
    SELECT 'other' || n, 'poll', now() FROM generate_series(1, 20000) n`);
  await db.pool.query('ANALYZE rate_buckets');
  for (const i of inboxes) await one.gate.admit(request(i, i.credentials.reader));
  const tat = async () =>
    new Map(
      (
        await db.pool.query<{ inbox_id: string; tat: Date }>(
          "SELECT inbox_id, tat FROM rate_buckets WHERE bucket = 'poll' AND inbox_id = ANY($1)",
          [inboxes.map((i) => i.inbox_id)],
        )
      ).rows.map((r) => [r.inbox_id, r.tat.getTime()]),
    );
  const before = await tat();
  const rounds = 15;
  const admissions = await Promise.all(
    Array.from({ length: rounds }, () => [
      ...inboxes.map((i) => one.gate.admit(request(i, i.credentials.reader))),
      ...[...inboxes].reverse().map((i) => two.gate.admit(request(i, i.credentials.owner))),
    ]).flat(),
  );
  assert.equal(admissions.length, rounds * inboxes.length * 2);
  assert.ok(admissions.every((a) => a?.bucket === 'taken'));
  assert.ok(one.statements.includes('admit-batch') && two.statements.includes('admit-batch'));
  // The clock stood still: every token moved the bucket's tat on by exactly one interval.
  const after = await tat();
  for (const i of inboxes) {
    const moved = (after.get(i.inbox_id) ?? 0) - (before.get(i.inbox_id) ?? 0);
    assert.equal(moved, (rounds * 2 * 1000) / perSecond, i.inbox_id);
  }
});

test('the batch statement finds credentials by index and skips the usage scan unless asked', async () => {
  const inbox = await h.provision();
  await h.deliver(inbox.inbox_id, 'Subject: one\r\n\r\nbody\r\n');
  const db = h.container.resolve<Database>(TOKENS.Database);
  const now = h.clock.now().toISOString();
  const hash = hashCredential(inbox.credentials.reader).toString('hex');
  const plan = (withUsage: boolean) =>
    db.withClient(async (client) => {
      await client.query(`PREPARE batch_probe AS ${ADMIT_BATCH_SQL}`);
      try {
        const result = await client.query(
          `EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) EXECUTE batch_probe(ARRAY['\\x${hash}']::bytea[],
            ARRAY['poll'], ARRAY['${inbox.inbox_id}'], ARRAY[false], ARRAY['${now}']::timestamptz[],
            ARRAY['${now}']::timestamptz[], ARRAY[0.001], ARRAY[1.0], ARRAY[${withUsage}], ARRAY[NULL]::int8[])`,
        );
        return result.rows.map((r: Record<string, string>) => String(r['QUERY PLAN']));
      } finally {
        await client.query('DEALLOCATE batch_probe');
      }
    });
  const skipped = await plan(false);
  assert.match(skipped.find((l) => / on messages\b/.test(l)) ?? '', /never executed/);
  assert.ok(
    skipped.some((l) => /Index Scan using \w+ on credentials/.test(l)),
    skipped.join('\n'),
  );
  assert.ok(!skipped.some((l) => /Seq Scan on credentials/.test(l)));
  const read = await plan(true);
  assert.doesNotMatch(read.find((l) => / on messages\b/.test(l)) ?? '', /never executed/);
});

test('a request whose parameters Postgres refuses fails alone; the others in its batch are answered', async () => {
  const { gate, statements } = gatekeeper(100);
  const [a, b] = [await h.provision(), await h.provision()];
  await gate.admit(request(a, a.credentials.reader));
  await gate.admit(request(b, b.credentials.reader));
  statements.length = 0;
  // A NUL in text is refused by Postgres (22021): the shared statement fails for the whole batch.
  const poison = { ...request(a, a.credentials.reader), inboxId: 'x\0y' };
  const results = await Promise.allSettled([
    gate.admit(request(a, a.credentials.reader)),
    gate.admit(poison),
    gate.admit(request(b, b.credentials.reader)),
  ]);
  assert.equal(statements[0], 'admit-batch');
  assert.deepEqual(
    results.map((r) => (r.status === 'fulfilled' ? outcome(r.value) : 'failed')),
    [`${a.inbox_id} reader taken`, 'failed', `${b.inbox_id} reader taken`],
  );
});

test('a batch that fails for any other reason (a lost connection, perhaps after its commit) is not run again', async () => {
  // Running it again one by one could take a token twice, and multiplies the work against a
  // database that is already failing (a review found both).
  const { gate, statements, db } = gatekeeper(100);
  const [a, b] = [await h.provision(), await h.provision()];
  await gate.admit(request(a, a.credentials.reader));
  await gate.admit(request(b, b.credentials.reader));
  statements.length = 0;
  const rows = db.rows;
  db.rows = (name, text, values, on) => {
    if (name !== 'admit-batch') return rows(name, text, values, on);
    statements.push(name);
    return Promise.reject(Object.assign(new Error('connection lost'), { code: '08006' }));
  };
  const results = await Promise.allSettled([
    gate.admit(request(a, a.credentials.reader)),
    gate.admit(request(b, b.credentials.reader)),
  ]);
  db.rows = rows;
  assert.deepEqual(
    results.map((r) => r.status),
    ['rejected', 'rejected'],
  );
  assert.deepEqual(statements, ['admit-batch']);
});
