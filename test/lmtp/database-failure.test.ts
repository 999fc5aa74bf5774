/**
 * The receiver when Postgres fails: every recipient whose message could not be stored gets
 * `451 4.3.0`, never a 5xx (DESIGN decision 1; STYLE 4), the rest of the message is still read so the
 * LMTP connection stays in step, and Postfix's retry of the same queue id then stores one copy.
 * Real failures: a database nobody listens on, and the test's database dropped under the receiver.
 */
import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, test } from 'node:test';
import type { LmtpServer } from '../../src/lmtp/server.ts';
import type { LogLine } from '../../src/log.ts';
import { Database } from '../../src/storage/database.ts';
import { PgMessageStore } from '../../src/storage/message-store.ts';
import { type Harness, startHarness } from '../support/harness.ts';
import { deliverRaw, LmtpClient } from './lmtp-client.ts';
import { startTestReceiver } from './test-receiver.ts';

let h: Harness;
const logs: LogLine[] = [];
const servers: LmtpServer[] = [];
const databases: Database[] = [];

before(async () => {
  h = await startHarness({ POLL_RATE_BURST: '100000' });
});
after(async () => {
  for (const server of servers) await server.close();
  for (const database of databases) await database.close();
  await h.close();
});

const DEFERRED = '451 4.3.0 inbox.test: temporary failure storing the message, try again later';

async function receiverOver(databaseUrl: string): Promise<number> {
  const database = new Database(databaseUrl, 4);
  databases.push(database);
  const server = await startTestReceiver(h, {
    log: (line) => logs.push(line),
    store: new PgMessageStore(database),
  });
  servers.push(server);
  return server.port as number;
}

/** A TCP port on loopback that nothing listens on (bound, then released). */
async function closedPort(): Promise<number> {
  const probe = net.createServer();
  await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve));
  const { port } = probe.address() as net.AddressInfo;
  await new Promise((resolve) => probe.close(resolve));
  return port;
}

const bigBody = (lines: number) =>
  Buffer.concat([
    Buffer.from('Subject: big\r\n\r\n'),
    Buffer.alloc(lines * 80, `${'abcdefghij'.repeat(7)}01234567\r\n`),
  ]);

test('a database nobody listens on: 451 4.3.0 for each inbox recipient, 250 for the others, and the connection stays in step', async () => {
  const port = await receiverOver(`postgres://postgres@127.0.0.1:${await closedPort()}/nothing`);
  const [a, b] = [await h.provision(), await h.provision()];
  const client = await LmtpClient.connect({ port });
  await client.command('LHLO postfix.test');
  for (let round = 0; round < 2; round++) {
    await client.command(`XFORWARD IDENT=DOWN${process.pid}R${round}`);
    await client.command('MAIL FROM:<a@example.org>');
    for (const rcpt of [a.address, 'x@other.test', b.address]) await client.command(`RCPT TO:<${rcpt}>`);
    // a megabyte of body: the receiver reads all of it although nothing is stored
    const replies = await client.data([bigBody(13_000)], 3);
    assert.deepEqual(replies, [DEFERRED, '250 2.0.0 not stored: no such inbox', DEFERRED]);
  }
  await client.quit();
  const failures = logs.filter((l) => l.msg === 'store failed; deferring');
  assert.ok(failures.some((l) => l.queue_id === `DOWN${process.pid}R0` && l.inbox_id === a.inbox_id));
});

test('Postfix retrying the deferred queue id once the database is back stores one copy', async () => {
  const inbox = await h.provision();
  const downPort = await receiverOver(`postgres://postgres@127.0.0.1:${await closedPort()}/nothing`);
  const upPort = await receiverOver(h.database.url);
  const delivery = {
    ident: `RETRY${process.pid}`,
    from: 'a@example.org',
    to: [inbox.address],
    body: 'Subject: retried\r\n\r\nx\r\n',
  };
  assert.deepEqual((await deliverRaw({ port: downPort }, delivery)).replies, [DEFERRED]);
  const stored = await deliverRaw({ port: upPort }, delivery);
  assert.match(stored.replies[0] as string, /^250 2\.0\.0 msg_\w+ stored$/);
  const again = await deliverRaw({ port: upPort }, delivery);
  assert.match(again.replies[0] as string, /^250 2\.0\.0 msg_\w+ already stored$/);
  const polled = await h.api.get(`/v1/inboxes/${inbox.inbox_id}/messages`, {
    token: inbox.credentials.reader,
  });
  assert.equal(polled.json.messages.length, 1);
});

// Last in this file: it drops the harness's database.
test('the database dropped under a running receiver: 451 4.3.0 for each recipient, never 5xx', async () => {
  const inbox = await h.provision();
  const port = await receiverOver(h.database.url);
  const warm = await deliverRaw(
    { port },
    {
      ident: `WARM${process.pid}`,
      from: 'a@example.org',
      to: [inbox.address],
      body: 'Subject: warm\r\n\r\nx\r\n',
    },
  );
  assert.match(warm.replies[0] as string, /^250 /);
  await h.database.drop();
  const { replies } = await deliverRaw(
    { port },
    {
      ident: `GONE${process.pid}`,
      from: 'a@example.org',
      to: [inbox.address, inbox.address],
      body: bigBody(2000),
    },
  );
  assert.deepEqual(replies, [DEFERRED, DEFERRED]);
});
