/**
 * ops-server - the operations port of a process: Prometheus metrics and health probes, on
 * METRICS_HOST:METRICS_PORT, apart from the API and the mail protocols.
 *
 *   GET /metrics  the process's Registry in Prometheus' text format (metrics.ts)
 *   GET /livez    200 {"ok":true} while the process runs
 *   GET /readyz   200 {"ok":true,...} when the database answers and the process is not stopping,
 *                 else 503 (health.ts)
 *
 * One per process: `node src/main.ts all` serves every daemon's metrics on one port. When METRICS_PORT
 * is unset each entry point takes its own default (DEFAULT_METRICS_PORTS), so the daemons of one host
 * do not collide; `off` serves nothing. Plain node:http: nothing here needs Koa.
 * Security: metrics show volumes and reasons, never ids, addresses or content; still, keep the port
 * on a private network (the default host is 127.0.0.1).
 */
import { createServer, type Server } from 'node:http';
import type { Log } from '../log.ts';
import type { Health } from './health.ts';
import type { Metrics } from './metrics.ts';

/** 9464 is the usual Prometheus exporter port; the daemons run separately take the next ones. */
export const DEFAULT_METRICS_PORTS: Record<string, number> = {
  all: 9464,
  api: 9464,
  policy: 9465,
  milter: 9466,
  lmtp: 9467,
  jobs: 9468,
};

export interface OpsServer {
  server: Server;
  /** `http://host:port` with the port actually bound. */
  url: string;
  close(): Promise<void>;
}

export async function startOpsServer(options: {
  host: string;
  port: number;
  metrics: Metrics;
  health: Health;
  log: Log;
}): Promise<OpsServer> {
  const { metrics, health, log } = options;
  const server = createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    const json = (status: number, body: unknown) => {
      res.writeHead(status, { 'content-type': 'application/json', 'cache-control': 'no-store' });
      res.end(JSON.stringify(body));
    };
    if (req.method !== 'GET' && req.method !== 'HEAD') return json(405, { ok: false });
    if (path === '/livez') return json(200, { ok: true });
    if (path === '/readyz') {
      void health.ready().then((readiness) => json(readiness.ok ? 200 : 503, readiness));
      return;
    }
    if (path === '/metrics') {
      metrics.registry.metrics().then(
        (text) => {
          res.writeHead(200, { 'content-type': metrics.registry.contentType });
          res.end(text);
        },
        (error: unknown) => {
          log({ level: 'error', msg: 'metrics collection failed', error: String(error) });
          json(500, { ok: false });
        },
      );
      return;
    }
    json(404, { ok: false });
  });
  server.keepAliveTimeout = 65_000;
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port, options.host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  server.on('error', (error) => log({ level: 'error', msg: 'ops server error', error: error.message }));
  const bound = server.address();
  const port = typeof bound === 'object' && bound ? bound.port : options.port;
  const host = options.host.includes(':') ? `[${options.host}]` : options.host;
  let closing: Promise<void> | undefined;
  return {
    server,
    url: `http://${host}:${port}`,
    close() {
      closing ??= new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      });
      return closing;
    },
  };
}
