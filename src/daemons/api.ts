/**
 * api - the HTTP API of contract sections 4-9.
 *
 * Listens on:   API_HOST:API_PORT (HTTP; put TLS in front of it).
 * Reads/writes: inboxes, credentials, messages and chunks, rejections, rate buckets, idempotency
 *               records, opt-outs (all in Postgres).
 * On failure:   a request that fails unexpectedly answers 500 internal with a request id, logged here;
 *               the database being down makes requests fail, never lose or change data.
 * Security:     credentials are compared by SHA-256 only; unknown, malformed, foreign and purged
 *               credentials all answer the same 401; no message content or credential is logged.
 */
import type { Server } from 'node:http';
import type { DependencyContainer } from 'tsyringe';
import type { Config } from '../config/config.ts';
import { TOKENS } from '../container.ts';
import { createApp } from '../http/app.ts';
import type { HttpServices } from '../http/services.ts';

export async function startApi(container: DependencyContainer): Promise<Server> {
  const config = container.resolve<Config>(TOKENS.Config);
  const app = createApp(container.resolve<HttpServices>(TOKENS.HttpServices));
  const server = app.listen(config.apiPort, config.apiHost);
  server.keepAliveTimeout = 65_000;
  await new Promise<void>((resolve, reject) => {
    server.once('listening', resolve);
    server.once('error', reject);
  });
  return server;
}
