/**
 * listen - puts a net.Server (or anything with the same listen/address) on a Listen: a TCP address
 * (port 0 picks a free port) or a unix socket path. Shared by the policy daemon, the milter and the
 * LMTP receiver, which Postfix reaches at these addresses.
 *
 * A unix socket file left by a crash is replaced; a live socket (EADDRINUSE) or a path that is not a
 * socket is refused. The socket is opened to every user: Postfix connects as its own user, and the
 * directory holding the socket is the access control (keep it reachable only by Postfix and us).
 */
import { chmod, lstat, unlink } from 'node:fs/promises';
import net from 'node:net';
import type { Listen } from '../config/config.ts';

interface Listenable {
  listen(path: string, ready: () => void): unknown;
  listen(port: number, host: string, ready: () => void): unknown;
  once(event: 'error', listener: (error: Error) => void): unknown;
  off(event: 'error', listener: (error: Error) => void): unknown;
}

export interface Bound {
  /** `inet:host:port` with the port actually bound (IPv6 in brackets), or `unix:path`. */
  address: string;
  /** The bound TCP port; absent for a unix socket. */
  port?: number;
}

/** Listens and resolves once bound; `address()` reads the bound address (net.Server's own). */
export async function listenOn(
  server: Listenable,
  listen: Listen,
  address: () => net.AddressInfo | string | null,
): Promise<Bound> {
  if ('path' in listen) await removeStaleSocket(listen.path);
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    const ready = () => {
      server.off('error', reject);
      resolve();
    };
    if ('path' in listen) server.listen(listen.path, ready);
    else server.listen(listen.port, listen.host, ready);
  });
  if ('path' in listen) {
    await chmod(listen.path, 0o666);
    return { address: `unix:${listen.path}` };
  }
  const bound = address();
  if (bound === null || typeof bound === 'string') throw new Error('a TCP listener has no TCP address');
  const host = bound.family === 'IPv6' ? `[${bound.address}]` : bound.address;
  return { address: `inet:${host}:${bound.port}`, port: bound.port };
}

/** Removes a socket file nobody listens on (left by a crash); refuses to touch anything else. */
async function removeStaleSocket(path: string): Promise<void> {
  const stat = await lstat(path).catch((error: NodeJS.ErrnoException) => {
    if (error.code === 'ENOENT') return undefined;
    throw error;
  });
  if (!stat) return;
  if (!stat.isSocket()) throw new Error(`${path} exists and is not a socket`);
  const live = await new Promise<boolean>((resolve) => {
    const probe = net.connect(path);
    probe.once('connect', () => {
      probe.destroy();
      resolve(true);
    });
    probe.once('error', () => resolve(false));
  });
  if (live) {
    throw Object.assign(new Error(`${path}: another process is listening on this socket`), {
      code: 'EADDRINUSE',
    });
  }
  await unlink(path);
}
