/**
 * server - the policy listener on real sockets (127.0.0.1:0 and a unix socket), with literal transcripts
 * of what Postfix would read back.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtemp, rm, stat, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, afterEach, describe, test } from 'node:test';
import type { Verdict } from '../../src/core/verdict.ts';
import type { LogLine } from '../../src/log.ts';
import type { PolicyConnection, PolicyHandler, PolicyRequest } from '../../src/policy/handler.ts';
import { type PolicyServer, startPolicyServer } from '../../src/policy/server.ts';

const rcpt = (recipient: string, extra: string[] = []) =>
  `${[
    'request=smtpd_access_policy',
    'protocol_state=RCPT',
    'protocol_name=ESMTP',
    'client_address=127.0.0.3',
    'client_name=mail.sender.test',
    'reverse_client_name=mail.sender.test',
    'helo_name=mail.sender.test',
    'sender=s@allowed.test',
    `recipient=${recipient}`,
    'instance=6717.6b016c6e.a2268.0',
    'size=1234',
    ...extra,
  ].join('\n')}\n\n`;

const NO_SUCH_INBOX: Verdict = { kind: 'reject', code: 555, dsn: '5.7.1', text: 'svc: no such inbox' };

/** A handler that records every connection and request; `decide` picks the verdict. */
function recordingHandler(decide: (request: PolicyRequest) => Promise<Verdict>) {
  const connections: {
    requests: PolicyRequest[];
    /** answered(): the recipient and what Postfix got ('none' for no reply). */
    answers: [string, string][];
    closed: number;
    connection: PolicyConnection;
  }[] = [];
  const handler: PolicyHandler = {
    connect() {
      const record = {
        requests: [] as PolicyRequest[],
        answers: [] as [string, string][],
        closed: 0,
        connection: {
          decide(request: PolicyRequest) {
            record.requests.push(request);
            return decide(request);
          },
          answered(request: PolicyRequest, verdict: Verdict | null) {
            record.answers.push([request.recipient, verdict === null ? 'none' : verdict.kind]);
          },
          close() {
            record.closed++;
          },
        },
      };
      connections.push(record);
      return record.connection;
    },
  };
  return { handler, connections };
}

const inboxRule = async (request: PolicyRequest): Promise<Verdict> =>
  request.recipient.startsWith('good@') ? { kind: 'accept' } : NO_SUCH_INBOX;

/** A client that collects everything the server writes and notices the close. */
class Client {
  readonly socket: net.Socket;
  received = '';
  readonly closed: Promise<string>;
  #waiters: (() => void)[] = [];

  constructor(target: { port?: number; path?: string }) {
    this.socket = target.path ? net.connect(target.path) : net.connect(target.port as number, '127.0.0.1');
    this.socket.setEncoding('utf8');
    this.socket.on('data', (text: string) => {
      this.received += text;
      for (const wake of this.#waiters.splice(0)) wake();
    });
    this.socket.on('error', () => {});
    this.closed = new Promise((resolve) => this.socket.once('close', () => resolve(this.received)));
  }

  /** Waits until `count` complete replies have arrived; returns them. */
  async replies(count: number): Promise<string[]> {
    for (;;) {
      const replies = this.received.match(/[^\n]*\n\n/g) ?? [];
      if (replies.length >= count) return replies;
      await new Promise<void>((resolve) => this.#waiters.push(resolve));
    }
  }

  async ask(request: string): Promise<string> {
    const before = (this.received.match(/[^\n]*\n\n/g) ?? []).length;
    this.socket.write(request);
    return (await this.replies(before + 1))[before] as string;
  }
}

const servers: PolicyServer[] = [];
const logs: LogLine[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => s.close()));
  logs.length = 0;
});

async function start(handler: PolicyHandler, listen: { host: string; port: number } | { path: string }) {
  const server = await startPolicyServer({ listen, handler, log: (line) => logs.push(line) });
  servers.push(server);
  return server;
}
const startInet = (handler: PolicyHandler) => start(handler, { host: '127.0.0.1', port: 0 });

/**
 * Sends one request and expects internal trouble's handling: the socket closed with no byte written,
 * close() called, a warning logged (returned).
 */
async function droppedWithoutReply(server: PolicyServer, connections: { closed: number }[]) {
  const client = new Client(server);
  client.socket.write(rcpt('good@svc.test'));
  assert.equal(await client.closed, '');
  await waitFor(() => connections[0]?.closed === 1);
  const warning = logs.find((l) => l.level === 'warn');
  assert.match(String(warning?.msg), /decision failed/);
  return warning;
}

describe('policy server transcripts', () => {
  test('a known recipient is answered action=DUNNO and an unknown one action=555 5.7.1 svc: no such inbox', async () => {
    const { handler, connections } = recordingHandler(inboxRule);
    const server = await startInet(handler);
    const client = new Client(server);
    assert.equal(await client.ask(rcpt('good@svc.test')), 'action=DUNNO\n\n');
    assert.equal(await client.ask(rcpt('nosuch@svc.test')), 'action=555 5.7.1 svc: no such inbox\n\n');
    assert.equal(client.received, 'action=DUNNO\n\naction=555 5.7.1 svc: no such inbox\n\n');
    assert.deepEqual(connections[0]?.answers, [
      ['good@svc.test', 'accept'],
      ['nosuch@svc.test', 'reject'],
    ]);
    client.socket.end();
    await client.closed;
  });

  test('a defer verdict is sent as its 4xx action with newlines in the text flattened', async () => {
    const { handler } = recordingHandler(async () => ({
      kind: 'defer',
      code: 451,
      dsn: '4.7.1',
      text: 'svc: try\r\nlater',
    }));
    const server = await startInet(handler);
    const client = new Client(server);
    assert.equal(await client.ask(rcpt('good@svc.test')), 'action=451 4.7.1 svc: try later\n\n');
    client.socket.end();
  });

  test('two requests in one write get two replies, in request order, decided one at a time', async () => {
    let running = 0;
    let overlapped = false;
    const { handler, connections } = recordingHandler(async (request) => {
      running++;
      if (running > 1) overlapped = true;
      // The first decision is the slow one: a server deciding in parallel would answer it second.
      await new Promise((r) => setTimeout(r, request.recipient.startsWith('nosuch') ? 50 : 1));
      running--;
      return inboxRule(request);
    });
    const server = await startInet(handler);
    const client = new Client(server);
    client.socket.write(rcpt('nosuch@svc.test') + rcpt('good@svc.test'));
    assert.deepEqual(await client.replies(2), [
      'action=555 5.7.1 svc: no such inbox\n\n',
      'action=DUNNO\n\n',
    ]);
    assert.equal(overlapped, false);
    assert.deepEqual(
      connections[0]?.requests.map((r) => r.recipient),
      ['nosuch@svc.test', 'good@svc.test'],
    );
    client.socket.end();
  });

  test('CRLF requests are answered like LF ones', async () => {
    const { handler } = recordingHandler(inboxRule);
    const server = await startInet(handler);
    const client = new Client(server);
    assert.equal(await client.ask(rcpt('good@svc.test').replaceAll('\n', '\r\n')), 'action=DUNNO\n\n');
    client.socket.end();
  });
});

describe('policy server connections', () => {
  test('each TCP connection gets one connect() and the same PolicyConnection for all its requests', async () => {
    const { handler, connections } = recordingHandler(inboxRule);
    const server = await startInet(handler);
    const first = new Client(server);
    const second = new Client(server);
    await first.ask(rcpt('good@svc.test'));
    await second.ask(rcpt('a@svc.test'));
    await first.ask(rcpt('b@svc.test'));
    await first.ask(rcpt('c@svc.test'));
    assert.equal(connections.length, 2);
    assert.deepEqual(
      connections.map((c) => c.requests.map((r) => r.recipient)),
      [['good@svc.test', 'b@svc.test', 'c@svc.test'], ['a@svc.test']],
    );
    first.socket.end();
    second.socket.end();
  });

  test('close() is called once when Postfix disconnects, and only for that connection', async () => {
    const { handler, connections } = recordingHandler(inboxRule);
    const server = await startInet(handler);
    const leaving = new Client(server);
    const staying = new Client(server);
    await leaving.ask(rcpt('good@svc.test'));
    await staying.ask(rcpt('good@svc.test'));
    leaving.socket.end();
    await leaving.closed;
    await waitFor(() => connections[0]?.closed === 1);
    assert.deepEqual(
      connections.map((c) => c.closed),
      [1, 0],
    );
    assert.equal(await staying.ask(rcpt('good@svc.test')), 'action=DUNNO\n\n');
  });

  test('a handler rejection closes the socket with no bytes written, logs a warning, and calls close()', async () => {
    const { handler, connections } = recordingHandler(async () => {
      throw new Error('database unreachable');
    });
    const warning = await droppedWithoutReply(await startInet(handler), connections);
    assert.equal(warning?.instance, '6717.6b016c6e.a2268.0');
    assert.match(String(warning?.error), /database unreachable/);
  });

  test('a decision past its deadline (a stalled database) closes the socket without a reply and logs it', async () => {
    const { handler, connections } = recordingHandler(() => new Promise<Verdict>(() => {}));
    const server = await startPolicyServer({
      listen: { host: '127.0.0.1', port: 0 },
      handler,
      log: (line) => logs.push(line),
      decisionDeadlineMs: 200,
    });
    servers.push(server);
    const warning = await droppedWithoutReply(server, connections);
    assert.match(String(warning?.error), /longer than 200 ms/);
    // The handler hears that Postfix got no reply (its metrics counted the late verdict until 2026-11-25).
    assert.deepEqual(connections[0]?.answers, [['good@svc.test', 'none']]);
  });

  test('a request queued behind a failed decision is never answered', async () => {
    const { handler, connections } = recordingHandler(async (request) => {
      if (request.recipient.startsWith('nosuch')) throw new Error('boom');
      return { kind: 'accept' };
    });
    const server = await startInet(handler);
    const client = new Client(server);
    client.socket.write(rcpt('nosuch@svc.test') + rcpt('good@svc.test'));
    assert.equal(await client.closed, '');
    assert.equal(connections[0]?.requests.length, 1);
  });

  test('a verdict that cannot be encoded is treated as internal trouble: no reply, disconnect', async () => {
    const { handler } = recordingHandler(async () => ({
      kind: 'reject',
      code: 250,
      dsn: '2.0.0',
      text: 'bug',
    }));
    const server = await startInet(handler);
    const client = new Client(server);
    client.socket.write(rcpt('good@svc.test'));
    assert.equal(await client.closed, '');
  });

  const violations: [string, string][] = [
    ['a line without "="', 'request=smtpd_access_policy\nhello\n\n'],
    ['a missing request=smtpd_access_policy', 'protocol_state=RCPT\nrecipient=good@svc.test\n\n'],
    ['an over-long line', `request=smtpd_access_policy\nsender=${'a'.repeat(9000)}\n\n`],
  ];
  for (const [name, input] of violations) {
    test(`${name} disconnects without a reply, logs a warning and never reaches the handler`, async () => {
      const { handler, connections } = recordingHandler(inboxRule);
      const server = await startInet(handler);
      const client = new Client(server);
      assert.equal(await client.ask(rcpt('good@svc.test')), 'action=DUNNO\n\n');
      client.socket.write(input);
      assert.equal(await client.closed, 'action=DUNNO\n\n');
      assert.equal(connections[0]?.requests.length, 1);
      assert.equal(logs.find((l) => l.level === 'warn')?.msg, 'policy protocol error; disconnecting');
      await waitFor(() => connections[0]?.closed === 1);
    });
  }
});

describe('policy server lifecycle', () => {
  const dirs: string[] = [];
  after(async () => Promise.all(dirs.map((d) => rm(d, { recursive: true, force: true }))));
  const tempDir = async () => {
    const dir = await mkdtemp(join(tmpdir(), 'policy-test-'));
    dirs.push(dir);
    return dir;
  };

  test('port 0 binds a free port and reports inet:127.0.0.1:<port>', async () => {
    const server = await startInet(recordingHandler(inboxRule).handler);
    assert.ok(server.port && server.port > 0);
    assert.equal(server.address, `inet:127.0.0.1:${server.port}`);
  });

  test('a unix socket is served, and a stale socket file from a crash is replaced', async () => {
    const path = join(await tempDir(), 'policy.sock');
    // A socket file nobody listens on, as a daemon killed with SIGKILL leaves it.
    const daemon = spawn(process.execPath, [
      '-e',
      `require('node:net').createServer().listen(${JSON.stringify(path)}, () => console.log('up'))`,
    ]);
    await new Promise((r) => daemon.stdout.once('data', r));
    const exited = new Promise((r) => daemon.once('exit', r));
    daemon.kill('SIGKILL');
    await exited;
    assert.ok((await stat(path)).isSocket());
    const server = await start(recordingHandler(inboxRule).handler, { path });
    assert.equal(server.address, `unix:${path}`);
    assert.equal(server.port, undefined);
    const client = new Client({ path });
    assert.equal(await client.ask(rcpt('nosuch@svc.test')), 'action=555 5.7.1 svc: no such inbox\n\n');
    client.socket.end();
  });

  test('a unix socket a live server listens on is not taken over', async () => {
    const path = join(await tempDir(), 'policy.sock');
    await start(recordingHandler(inboxRule).handler, { path });
    await assert.rejects(start(recordingHandler(inboxRule).handler, { path }), { code: 'EADDRINUSE' });
  });

  test('a regular file in the socket path is left alone', async () => {
    const path = join(await tempDir(), 'not-a-socket');
    await writeFile(path, 'keep me');
    await assert.rejects(start(recordingHandler(inboxRule).handler, { path }), /not a socket/);
    assert.ok((await stat(path)).isFile());
  });

  test('close() lets the decision in progress answer, ends idle connections, then stops accepting', async () => {
    let release: () => void = () => {};
    const gate = new Promise<void>((r) => {
      release = r;
    });
    const { handler, connections } = recordingHandler(async (request) => {
      if (request.recipient.startsWith('slow')) await gate;
      return { kind: 'accept' };
    });
    const server = await startInet(handler);
    const busy = new Client(server);
    const idle = new Client(server);
    await idle.ask(rcpt('good@svc.test'));
    busy.socket.write(rcpt('slow@svc.test'));
    await waitFor(() => connections[0]?.requests.length === 1);
    const closing = server.close();
    assert.equal(await idle.closed, 'action=DUNNO\n\n');
    release();
    assert.equal(await busy.closed, 'action=DUNNO\n\n');
    await closing;
    const refused = new Client(server);
    await refused.closed;
    assert.equal(refused.received, '');
    assert.equal(server.server.listening, false);
  });
});

async function waitFor(condition: () => boolean): Promise<void> {
  for (let i = 0; i < 200 && !condition(); i++) await new Promise((r) => setTimeout(r, 5));
  assert.ok(condition(), 'condition not reached within 1 s');
}
