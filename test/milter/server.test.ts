/**
 * server - the milter listener: its address in smtpd_milters syntax, unix sockets (stale ones replaced,
 * live ones and other files left alone), and close() letting a transaction in progress finish.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtemp, rm, stat, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { ACCEPT } from '../../src/core/verdict.ts';
import { startMilterServer } from '../../src/milter/server.ts';
import { FakeHandler, sleep, startFake } from './fake-handler.ts';
import { envelope, MtaClient, packet, show, u32 } from './mta-client.ts';

let dir: string;
before(async () => {
  dir = await mkdtemp(join(tmpdir(), 'milter-test-'));
});
after(() => rm(dir, { recursive: true, force: true }));

const start = (path: string) =>
  startMilterServer({ listen: { path }, handler: new FakeHandler(), log: () => {} });

describe('listening', () => {
  test('on 127.0.0.1 port 0 the address is inet:127.0.0.1:<port>', async () => {
    const { milter } = await startFake();
    const { port } = milter.server.address() as net.AddressInfo;
    assert.equal(milter.address, `inet:127.0.0.1:${port}`);
    await milter.close();
  });

  test('a stale unix socket file is replaced and the address is unix:<path>', async () => {
    const path = join(dir, 'stale.sock');
    // A process that dies without cleaning up leaves its socket file behind.
    const child = spawn(process.execPath, [
      '-e',
      `require('net').createServer().listen(${JSON.stringify(path)}, () => console.log('up'))`,
    ]);
    await new Promise((resolve) => child.stdout.once('data', resolve));
    child.kill('SIGKILL');
    await new Promise((resolve) => child.once('exit', resolve));
    assert.equal((await stat(path)).isSocket(), true);

    const milter = await start(path);
    assert.equal(milter.address, `unix:${path}`);
    const mta = await MtaClient.connect(milter.address);
    assert.equal((await mta.negotiate()).command, 'O');
    mta.close();
    await milter.close();
    await assert.rejects(stat(path), { code: 'ENOENT' }); // closing removes our socket file
  });

  test('a unix socket another process listens on is left alone', async () => {
    const path = join(dir, 'live.sock');
    const live = net.createServer().listen(path);
    await new Promise((resolve) => live.once('listening', resolve));
    await assert.rejects(start(path), /another process is listening/);
    live.close();
  });

  test('a path that is not a socket is refused', async () => {
    const path = join(dir, 'plain-file');
    await writeFile(path, 'keep me');
    await assert.rejects(start(path), /not a socket/);
    assert.equal((await stat(path)).isFile(), true);
  });
});

describe('close()', () => {
  test('an idle connection is ended at once', async () => {
    const { milter } = await startFake();
    const mta = await MtaClient.connect(milter.address);
    await mta.negotiate();
    const began = Date.now();
    await milter.close();
    await mta.closed;
    assert.ok(Date.now() - began < 1000, `took ${Date.now() - began} ms`);
  });

  test('an idle connection whose MTA never hangs up (as Postfix, until its next event) does not hold close() for the grace', async () => {
    const { milter } = await startFake();
    const [, port] = /^inet:127\.0\.0\.1:(\d+)$/.exec(milter.address) ?? [];
    const socket = net.connect({ port: Number(port), host: '127.0.0.1', allowHalfOpen: true });
    await new Promise((resolve) => socket.once('connect', resolve));
    const negotiated = new Promise((resolve) => socket.once('data', resolve));
    socket.write(packet('O', u32(6), u32(0x1ff), u32(0x1fffff)));
    await negotiated;
    const ended = new Promise((resolve) => socket.once('end', resolve));
    const began = Date.now();
    await milter.close(); // the fake's grace is CLOSE_GRACE_MS, 5 s
    assert.ok(Date.now() - began < 1000, `took ${Date.now() - began} ms`);
    await ended; // the MTA sees end of file when it next reads
    socket.destroy();
  });

  test('a transaction in progress gets its verdict, then the connection ends', async () => {
    const { milter, handler } = await startFake();
    const mta = await MtaClient.connect(milter.address);
    await mta.negotiate();
    await envelope(mta);
    mta.eoh();
    assert.equal(show(await mta.read()), 'c');
    handler.end = async () => {
      await sleep(100);
      return { verdict: ACCEPT };
    };
    mta.eob();
    await sleep(20);
    const closing = milter.close();
    assert.equal(show(await mta.read()), 'c');
    await closing;
    await mta.closed;
    await assert.rejects(MtaClient.connect(milter.address));
  });
});
