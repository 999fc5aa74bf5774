/**
 * api-process - a second API process on a harness's database: its own container (so its own caches,
 * pool and clock) behind a server on loopback, for tests of what one process keeps or decides apart.
 */
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { buildContainer, TOKENS } from '../../src/container.ts';
import type { Clock } from '../../src/core/clock.ts';
import { createApp } from '../../src/http/app.ts';
import type { HttpServices } from '../../src/http/services.ts';
import type { Database } from '../../src/storage/database.ts';
import { ApiClient, type Harness } from './harness.ts';

export interface ApiProcess {
  api: ApiClient;
  close(): Promise<void>;
}

export async function startApiProcess(
  h: Harness,
  options: { clock?: Clock; log?: (line: Record<string, unknown>) => void; poolSize?: number } = {},
): Promise<ApiProcess> {
  const container = buildContainer(
    { ...h.config },
    { clock: options.clock ?? h.clock, log: options.log ?? (() => {}), poolSize: options.poolSize ?? 2 },
  );
  const app = createApp(container.resolve<HttpServices>(TOKENS.HttpServices));
  const server: Server = await new Promise((resolve) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(s));
  });
  return {
    api: new ApiClient(`http://127.0.0.1:${(server.address() as AddressInfo).port}`),
    close: async () => {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
      await container.resolve<Database>(TOKENS.Database).close();
    },
  };
}
