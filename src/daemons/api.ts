/**
 * api - the HTTP API of contract sections 4-9, and the probes /livez and /readyz.
 *
 * Listens on:   API_HOST:API_PORT (HTTP; put TLS in front of it).
 * Reads/writes: inboxes, credentials, messages and chunks, rejections, rate buckets, idempotency
 *               records, opt-outs (all in Postgres).
 * On failure:   a request that fails unexpectedly answers 500 internal with a request id, logged here;
 *               the database being down makes requests fail (and /readyz answer 503), never lose or
 *               change data.
 * close():      stops accepting; requests in progress finish (their responses say `Connection: close`)
 *               for up to graceMs, idle keep-alive connections are closed at once; after the grace the
 *               rest are cut. Resolves when every connection is gone.
 * Security:     credentials are compared by SHA-256 only; unknown, malformed, foreign and purged
 *               credentials all answer the same 401; no message content or credential is logged.
 */
import { createServer, type Server, type ServerResponse } from 'node:http';
import type { DependencyContainer } from 'tsyringe';
import type { Config } from '../config/config.ts';
import { TOKENS } from '../container.ts';
import { createApp } from '../http/app.ts';
import { answerClientErrors } from '../http/client-errors.ts';
import type { HttpServices } from '../http/services.ts';

export interface ApiServer {
  server: Server;
  /** `http://host:port` with the port actually bound. */
  url: string;
  /** Idempotent: later calls return the first call's promise. */
  close(): Promise<void>;
}

/**
 * How long a connection may make no progress at all (nothing read, nothing written) before the server
 * ends it: a client that stops reading a download held its pending MiB in memory for as long as it
 * kept the connection (a review: 100 stalled downloads of one inbox, 240 MB). Longer than keep-alive's
 * 65 s, so only a stall ends a connection this way.
 */
export const STALL_TIMEOUT_MS = 120_000;

/** The API's HTTP server, not yet listening (the tests' harness serves the API through it too). */
export function createApiServer(services: HttpServices, stallTimeoutMs = STALL_TIMEOUT_MS): Server {
  // requireHostHeader off: the app answers a missing Host itself, with the contract's error body.
  const server = createServer({ requireHostHeader: false }, createApp(services).callback());
  server.keepAliveTimeout = 65_000;
  server.timeout = stallTimeoutMs;
  answerClientErrors(server);
  return server;
}

export async function startApi(container: DependencyContainer, graceMs: number): Promise<ApiServer> {
  const config = container.resolve<Config>(TOKENS.Config);
  const server = createApiServer(container.resolve<HttpServices>(TOKENS.HttpServices));
  server.listen(config.apiPort, config.apiHost);
  await new Promise<void>((resolve, reject) => {
    server.once('listening', resolve);
    server.once('error', reject);
  });
  const inFlight = new Set<ServerResponse>();
  server.on('request', (_request, response: ServerResponse) => {
    inFlight.add(response);
    response.once('close', () => inFlight.delete(response));
  });
  const bound = server.address();
  const port = typeof bound === 'object' && bound ? bound.port : config.apiPort;
  const host = config.apiHost.includes(':') ? `[${config.apiHost}]` : config.apiHost;

  let closing: Promise<void> | undefined;
  const close = () => {
    closing ??= new Promise<void>((resolve) => {
      for (const response of inFlight) {
        if (!response.headersSent) response.setHeader('Connection', 'close');
      }
      // A keep-alive connection whose response was under way when we began is idle once it is sent.
      const idle = setInterval(() => server.closeIdleConnections(), 50);
      const cut = setTimeout(() => server.closeAllConnections(), graceMs);
      server.close(() => {
        clearInterval(idle);
        clearTimeout(cut);
        resolve();
      });
      server.closeIdleConnections();
    });
    return closing;
  };
  return { server, url: `http://${host}:${port}`, close };
}
