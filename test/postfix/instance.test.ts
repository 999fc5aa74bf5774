/**
 * A real private Postfix (src/postfix/instance.ts) with the rendered configuration, in front of tiny
 * stand-ins for our three daemons: a policy server, a milter and an LMTP sink, all recording what
 * Postfix sent them. Mail comes from swaks bound to the test client addresses, and from a second,
 * sending Postfix (test/support/sender-postfix.ts). Postfix resolves through dnsmasq via a
 * bind-mounted resolv.conf. Needs root; every process started here is stopped in after().
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { chmod, mkdir, mkdtemp, rm } from 'node:fs/promises';
import { createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { type Config, loadConfig } from '../../src/config/config.ts';
import { findPostfix, PostfixInstance } from '../../src/postfix/instance.ts';
import { CLIENTS, testZone } from '../support/dns-zone.ts';
import { type Dnsmasq, startDnsmasq } from '../support/dnsmasq.ts';
import { freePort, type SenderPostfix, startSenderPostfix } from '../support/sender-postfix.ts';

type Where = { host: string; port: number } | { path: string };
interface StandIn {
  server: Server;
  address: string;
  close(): Promise<void>;
}

/** A server on `where` (a socket is made 0666: Postfix connects as the postfix user). */
async function standIn(where: Where, onConnection: (socket: Socket) => void): Promise<StandIn> {
  const sockets = new Set<Socket>();
  const server = createServer((socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    socket.on('error', () => {});
    onConnection(socket);
  });
  await new Promise<void>((done, fail) => {
    server.once('error', fail);
    if ('path' in where) server.listen(where.path, done);
    else server.listen(where.port, where.host, done);
  });
  if ('path' in where) await chmod(where.path, 0o666);
  const address = 'path' in where ? where.path : String(where.port);
  const close = () => {
    for (const socket of sockets) socket.destroy();
    return new Promise<void>((done) => server.close(() => done()));
  };
  return { server, address, close };
}

/** Policy delegation: records each request; the 2nd and later RCPT of one transaction get 452. */
function policyServer(requests: Record<string, string>[]) {
  return (socket: Socket) => {
    let buffer = '';
    const accepted = new Map<string, number>();
    socket.setEncoding('latin1');
    socket.on('data', (chunk: string) => {
      buffer += chunk;
      for (let end = buffer.indexOf('\n\n'); end !== -1; end = buffer.indexOf('\n\n')) {
        const lines = buffer.slice(0, end).split('\n');
        buffer = buffer.slice(end + 2);
        const request = Object.fromEntries(
          lines.map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]),
        );
        requests.push(request);
        let action = 'DUNNO';
        if (request.protocol_state === 'RCPT') {
          const count = (accepted.get(request.instance ?? '') ?? 0) + 1;
          accepted.set(request.instance ?? '', count);
          if (count > 1) action = '452 4.5.3 svc.test: one recipient per transaction here';
        }
        socket.write(`action=${action}\n\n`);
      }
    });
  };
}

/** Milter protocol 6: continue everywhere; at end of message record `{i}` and add one header. */
function milterServer(queueIds: string[]) {
  return (socket: Socket) => {
    let buffer = Buffer.alloc(0);
    const reply = (command: string, data = '') => {
      const packet = Buffer.alloc(5 + Buffer.byteLength(data, 'latin1'));
      packet.writeUInt32BE(packet.length - 4, 0);
      packet.write(command + data, 4, 'latin1');
      socket.write(packet);
    };
    socket.on('data', (chunk: Buffer) => {
      buffer = Buffer.concat([buffer, chunk]);
      while (buffer.length >= 4 && buffer.length >= 4 + buffer.readUInt32BE(0)) {
        const command = String.fromCharCode(buffer[4] ?? 0);
        const data = buffer.subarray(5, 4 + buffer.readUInt32BE(0)).toString('latin1');
        buffer = buffer.subarray(4 + buffer.readUInt32BE(0));
        if (command === 'O')
          reply('O', '\0\0\0\x06\0\0\0\x01\0\0\0\0'); // version 6, SMFIF_ADDHDRS
        else if (command === 'D' && data[0] === 'T')
          queueIds.push(/(?:^T|\0)i\0([^\0]*)/.exec(data)?.[1] ?? '');
        else if (command === 'E') {
          reply('h', 'X-Milter-Stand-In\0seen\0');
          reply('c');
        } else if (command === 'Q') socket.end();
        else if (command !== 'D' && command !== 'A') reply('c');
      }
    });
  };
}

interface Delivery {
  xforward: string[];
  rcptTo: string[];
  data: string;
}

const XFORWARD = 'XFORWARD NAME ADDR PORT PROTO HELO IDENT SOURCE';

/** LMTP (RFC 2033) advertising XFORWARD; one 250 per recipient after the final dot. */
function lmtpSink(deliveries: Delivery[], connections: { count: number }) {
  return (socket: Socket) => {
    connections.count++;
    let buffer = '';
    let current: Delivery = { xforward: [], rcptTo: [], data: '' };
    let inData = false;
    socket.setEncoding('latin1');
    socket.write('220 sink LMTP\r\n');
    socket.on('data', (chunk: string) => {
      buffer += chunk;
      for (let eol = buffer.indexOf('\r\n'); eol !== -1; eol = buffer.indexOf('\r\n')) {
        const line = buffer.slice(0, eol);
        buffer = buffer.slice(eol + 2);
        if (inData && line !== '.') current.data += `${line.replace(/^\./, '')}\r\n`;
        else if (inData) {
          inData = false;
          deliveries.push(current);
          socket.write(current.rcptTo.map(() => '250 2.0.0 stored\r\n').join(''));
          current = { xforward: [], rcptTo: [], data: '' };
        } else {
          const verb = line.slice(0, 4).toUpperCase();
          if (verb === 'XFOR') current.xforward.push(line.slice(9));
          if (verb === 'RCPT') current.rcptTo.push(line.slice(8));
          inData = verb === 'DATA';
          if (verb === 'LHLO')
            socket.write(`250-sink\r\n250-PIPELINING\r\n250-8BITMIME\r\n250 ${XFORWARD}\r\n`);
          else if (verb === 'DATA') socket.write('354 go ahead\r\n');
          else if (verb === 'QUIT') socket.end('221 2.0.0 Bye\r\n');
          else socket.write('250 2.0.0 Ok\r\n');
        }
      }
    });
  };
}

/** swaks' exit code and transcript (it exits non-zero when the server refuses). */
function swaks(args: string[]): Promise<{ code: number; output: string }> {
  return new Promise((done) =>
    execFile('swaks', ['--server', '127.0.0.1', '--timeout', '20', ...args], (error, stdout) =>
      done({ code: error ? Number(error.code) : 0, output: String(stdout) }),
    ),
  );
}

/** swaks with HELO mail.sender.test and MAIL FROM s@allowed.test, from `client` (default 127.0.0.1). */
function send(port: number, to: string, options: { client?: string; quitAfter?: string } = {}) {
  const args = ['--port', String(port), '--helo', 'mail.sender.test', '--from', 's@allowed.test', '--to', to];
  if (options.client) args.push('--local-interface', options.client);
  if (options.quitAfter) args.push('--quit-after', options.quitAfter);
  return swaks(args);
}

async function until<T>(
  what: string,
  probe: () => T | undefined | Promise<T | undefined>,
  ms = 15_000,
): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await probe();
    if (value !== undefined && value !== false) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(100);
  }
}

/** One MX instance with its own stand-ins, listening on TCP or on unix sockets. */
async function startMx(
  runDir: string,
  dns: Dnsmasq,
  sockets: 'inet' | 'unix',
  overrides: Record<string, string> = {},
) {
  await mkdir(runDir, { recursive: true, mode: 0o755 });
  const where = async (name: string): Promise<Where> =>
    sockets === 'unix'
      ? { path: join(runDir, `${name}.sock`) }
      : { host: '127.0.0.1', port: await freePort() };
  const seen = {
    policy: [] as Record<string, string>[],
    milterIds: [] as string[],
    deliveries: [] as Delivery[],
  };
  const lmtpConnections = { count: 0 };
  const policy = await standIn(await where('policy'), policyServer(seen.policy));
  const milter = await standIn(await where('milter'), milterServer(seen.milterIds));
  const lmtp = await standIn(await where('lmtp'), lmtpSink(seen.deliveries, lmtpConnections));
  const config: Config = loadConfig({
    MAIL_DOMAIN: 'svc.test',
    RUN_DIR: runDir,
    SMTP_PORT: String(await freePort()),
    POLICY_PORT: policy.address,
    MILTER_PORT: milter.address,
    LMTP_PORT: lmtp.address,
  });
  const mx = PostfixInstance.forService(config, overrides);
  const stop = async () => {
    await mx.stop();
    await Promise.all([policy.close(), milter.close(), lmtp.close()]);
  };
  try {
    await mx.prepare();
    await mx.start({ resolvConf: dns.resolvConfPath });
  } catch (error) {
    await stop();
    throw error;
  }
  return { postfix: mx, config, seen, lmtpConnections, policy, milter, stop };
}

let base: string;
let dns: Dnsmasq | undefined;
const cleanups: (() => Promise<void>)[] = [];

before(
  async () => {
    const problem = findPostfix();
    if (problem) throw new Error(problem);
    base = await mkdtemp(join(tmpdir(), 'postfix-live-'));
    await chmod(base, 0o755);
    dns = await startDnsmasq({ records: testZone().records });
  },
  { timeout: 30_000 },
);

after(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup().catch(() => {});
  await dns?.stop();
  if (base) await rm(base, { recursive: true, force: true });
});

describe('the receiving MX over TCP', { timeout: 60_000 }, () => {
  let mx: Awaited<ReturnType<typeof startMx>>;
  let sender: SenderPostfix;

  before(
    async () => {
      // A longer idle limit than the default 2 s, so a slow machine still reuses the LMTP connection.
      mx = await startMx(join(base, 'inet'), dns as Dnsmasq, 'inet', {
        lmtp_connection_cache_time_limit: '10s',
      });
      cleanups.push(mx.stop);
    },
    { timeout: 30_000 },
  );

  test('a message from 127.0.0.3 reaches the LMTP sink with XFORWARD IDENT = the queue id', async () => {
    const sent = await send(mx.config.smtpPort, 'box1@svc.test', { client: CLIENTS.good });
    assert.equal(sent.code, 0, sent.output);
    const queueId = /250 2\.0\.0 Ok: queued as (\w+)/.exec(sent.output)?.[1] as string;
    assert.match(queueId, /^[0-9A-Za-z]{12,}$/, 'a long queue id');
    const delivery = await until('the delivery', () =>
      mx.seen.deliveries.find((d) => d.data.includes(queueId)),
    );
    const port = /^NAME=mail\.sender\.test ADDR=127\.0\.0\.3 PORT=(\d+)$/.exec(
      delivery.xforward[0] ?? '',
    )?.[1];
    assert.ok(port, delivery.xforward[0]);
    assert.deepEqual(
      delivery.xforward[1],
      `PROTO=ESMTP HELO=mail.sender.test IDENT=${queueId} SOURCE=REMOTE`,
    );
    assert.deepEqual(delivery.rcptTo, ['<box1@svc.test>']);
    assert.match(delivery.data, /^X-Milter-Stand-In: seen\r$/m);
    assert.ok(mx.seen.milterIds.includes(queueId), 'the milter saw {i} = the queue id, with the DATA macros');
    const fromClient = mx.seen.policy.filter((r) => r.client_address === CLIENTS.good);
    // A client with a verified name is not asked about at CONNECT (check_client_access, postfix/README.md).
    assert.deepEqual(
      fromClient.map((r) => r.protocol_state),
      ['RCPT'],
    );
    assert.equal(fromClient[0]?.client_name, 'mail.sender.test', 'PTR and A record from dnsmasq');
    await until('an empty queue', () => mx.postfix.queueEmpty());
  });

  test('the next message reuses the cached LMTP connection', async () => {
    const before = mx.lmtpConnections.count;
    const sent = await send(mx.config.smtpPort, 'box2@svc.test', { client: CLIENTS.good });
    assert.equal(sent.code, 0, sent.output);
    await until('the delivery', () => mx.seen.deliveries.find((d) => d.rcptTo[0] === '<box2@svc.test>'));
    assert.equal(mx.lmtpConnections.count, before);
    assert.match(
      await mx.postfix.maillog(),
      /to=<box2@svc\.test>, relay=127\.0\.0\.1\[127\.0\.0\.1\]:\d+, conn_use=2/,
    );
  });

  test('Postfix sees a PTR without a matching A record as an unverified name', async () => {
    const sent = await send(mx.config.smtpPort, 'box@svc.test', {
      client: CLIENTS.unconfirmedPtr,
      quitAfter: 'CONNECT',
    });
    assert.equal(sent.code, 0, sent.output);
    const request = mx.seen.policy.find((r) => r.client_address === CLIENTS.unconfirmedPtr);
    assert.equal(request?.client_name, 'unknown');
    assert.equal(request?.reverse_client_name, 'nofwd.sender.test');
  });

  test('a retrying Postfix sender delivers a recipient refused with 452 in a later transaction', async () => {
    sender = await startSenderPostfix({
      runDir: join(base, 'inet'),
      relayHost: '127.0.0.1',
      relayPort: mx.config.smtpPort,
      backoffSeconds: 1,
      resolvConf: (dns as Dnsmasq).resolvConfPath,
    });
    cleanups.push(sender.stop);
    const sent = await send(sender.port, 'first@svc.test,second@svc.test');
    assert.equal(sent.code, 0, sent.output);
    await until('the deferral', async () => /said: 452 4\.5\.3 /.test(await sender.instance.maillog()));
    await sender.instance.flush(); // retry now rather than after the backoff
    const rcpts = () => mx.seen.deliveries.flatMap((d) => d.rcptTo);
    await until(
      'both recipients',
      () => rcpts().includes('<second@svc.test>') && rcpts().includes('<first@svc.test>'),
      20_000,
    );
    const separate = mx.seen.deliveries.filter((d) => /<(first|second)@svc\.test>/.test(d.rcptTo.join()));
    assert.equal(separate.length, 2, 'two transactions, two queue ids');
    assert.match(separate[0]?.xforward[0] ?? '', /^NAME=mail\.sender\.test ADDR=127\.0\.0\.3 /);
    assert.match(
      await sender.instance.maillog(),
      /status=deferred \(host 127\.0\.0\.1\[127\.0\.0\.1\] said: 452 4\.5\.3 /,
    );
    await until('the sender queue to drain', () => sender.instance.queueEmpty());
  });
});

describe('the receiving MX over unix sockets', { timeout: 60_000 }, () => {
  let mx: Awaited<ReturnType<typeof startMx>>;

  before(
    async () => {
      mx = await startMx(join(base, 'unix'), dns as Dnsmasq, 'unix');
      cleanups.push(mx.stop);
    },
    { timeout: 30_000 },
  );

  test('policy, milter and LMTP work as unix:/path endpoints', async () => {
    const sent = await send(mx.config.smtpPort, 'box@svc.test', { client: CLIENTS.good });
    assert.equal(sent.code, 0, sent.output);
    const delivery = await until('the delivery', () => mx.seen.deliveries[0]);
    assert.match(delivery.xforward[1] ?? '', /^PROTO=ESMTP HELO=mail\.sender\.test IDENT=\w+ SOURCE=REMOTE$/);
    assert.match(delivery.data, /^X-Milter-Stand-In: seen\r$/m);
  });

  test('without the milter, mail is refused with a temporary 451 4.7.1', async () => {
    await mx.milter.close();
    const sent = await send(mx.config.smtpPort, 'box@svc.test', { client: CLIENTS.good });
    assert.notEqual(sent.code, 0);
    assert.match(sent.output, /<\*\* +451 4\.7\.1 Service unavailable - try again later/);
  });

  test('without the policy server, a client without a verified name gets a temporary 451 4.3.5 greeting, a named one is greeted', async () => {
    await mx.policy.close();
    const unnamed = await send(mx.config.smtpPort, 'box@svc.test', {
      client: CLIENTS.unconfirmedPtr,
      quitAfter: 'CONNECT',
    });
    assert.match(
      unnamed.output,
      /<\*\* +451 4\.3\.5 <unknown\[127\.0\.0\.5\]>: Client host rejected: Server configuration problem/,
    );
    // A named client is greeted; what follows meets the milter closed by the test above (451 4.7.1 at
    // MAIL). test/mail/failures.test.ts has its RCPT refused with the policy daemon down.
    const named = await send(mx.config.smtpPort, 'box@svc.test', { client: CLIENTS.good });
    assert.match(named.output, /<- +220 /);
    assert.doesNotMatch(named.output, /Client host rejected/);
  });
});
