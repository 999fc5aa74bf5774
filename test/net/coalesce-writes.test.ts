/**
 * coalesceWrites: the writes of one turn of the event loop, promise continuations included, are held
 * (the socket is corked) until the turn ends, then leave together, in order; the next turn starts
 * uncorked; end() with data still works.
 */
import assert from 'node:assert/strict';
import { once } from 'node:events';
import net from 'node:net';
import { test } from 'node:test';
import { coalesceWrites } from '../../src/net/coalesce-writes.ts';

async function pair(): Promise<{ server: net.Socket; client: net.Socket; close: () => void }> {
  const listener = net.createServer();
  listener.listen(0, '127.0.0.1');
  await once(listener, 'listening');
  const accepted = once(listener, 'connection') as Promise<[net.Socket]>;
  const client = net.connect((listener.address() as net.AddressInfo).port, '127.0.0.1');
  const [server] = await accepted;
  await once(client, 'connect');
  return {
    server,
    client,
    close: () => {
      client.destroy();
      server.destroy();
      listener.close();
    },
  };
}

function received(socket: net.Socket): () => string {
  let text = '';
  socket.on('data', (data: Buffer) => {
    text += data.toString('latin1');
  });
  return () => text;
}

test('writes in one turn are corked together and sent in order once the turn ends', async () => {
  const { server, client, close } = await pair();
  try {
    coalesceWrites(server);
    const text = received(client);
    server.write('250 one\r\n');
    server.write(Buffer.from('250 two\r\n'));
    server.write('354 three\r\n');
    assert.equal(server.writableCorked, 1, 'held during the turn');
    await new Promise((resolve) => setImmediate(resolve));
    assert.equal(server.writableCorked, 0, 'released after it');
    while (!text().endsWith('three\r\n')) await once(client, 'data');
    assert.equal(text(), '250 one\r\n250 two\r\n354 three\r\n');

    server.write('250 later\r\n');
    server.end('221 bye\r\n');
    await once(client, 'end');
    assert.equal(text(), '250 one\r\n250 two\r\n354 three\r\n250 later\r\n221 bye\r\n');
  } finally {
    close();
  }
});

test('a write callback still runs once the data is flushed', async () => {
  const { server, client, close } = await pair();
  try {
    coalesceWrites(server);
    received(client);
    const flushed = new Promise<void>((resolve, reject) =>
      server.write('250 ok\r\n', (error) => (error ? reject(error) : resolve())),
    );
    await flushed;
    assert.equal(server.writableCorked, 0);
  } finally {
    close();
  }
});

test('replies written from a read callback and from the promises it starts leave in one write', async () => {
  const { server, client, close } = await pair();
  try {
    coalesceWrites(server);
    const text = received(client);
    const corkedAt: number[] = [];
    // As smtp-server answers pipelined commands: some at once, some after a handler's promise settles.
    server.on('data', () => {
      server.write('250 xforward\r\n');
      corkedAt.push(server.writableCorked);
      process.nextTick(() => {
        corkedAt.push(server.writableCorked);
        void Promise.resolve().then(() => {
          corkedAt.push(server.writableCorked);
          server.write('250 mail\r\n');
          void Promise.resolve().then(() => {
            server.write('354 data\r\n');
            corkedAt.push(server.writableCorked);
          });
        });
      });
    });
    client.write('XFORWARD\r\nMAIL\r\nDATA\r\n');
    while (!text().endsWith('354 data\r\n')) await once(client, 'data');
    assert.deepEqual(corkedAt, [1, 1, 1, 1], 'still corked after the nextTick and the promises');
    assert.equal(text(), '250 xforward\r\n250 mail\r\n354 data\r\n');
    assert.equal(server.writableCorked, 0);
  } finally {
    close();
  }
});
