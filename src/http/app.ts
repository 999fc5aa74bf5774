/**
 * app - the Koa application: request id, access log and metrics, error mapping, the /v1 routes, the
 * probes (/livez, /readyz), and 404 not_found for any path no endpoint serves.
 *
 * Request ids: an incoming `X-Request-Id` of 1 to 64 letters, digits, `_`, `.` or `-` is kept (a proxy
 * in front made it), anything else is replaced by a new UUID; the response carries it, and so does
 * every log line about the request. The access log has the route template, never the raw URL, and no
 * header: no credential reaches the log.
 */
import { randomUUID } from 'node:crypto';
import Router from '@koa/router';
import Koa, { type Context } from 'koa';
import { invalidRequest, noEndpoint } from '../core/errors.ts';
import { INBOX_ID } from '../core/ids.ts';
import { errorMiddleware } from './error-middleware.ts';
import { routeOf } from './request.ts';
import { registerInboxRoutes } from './routes/inbox-routes.ts';
import { registerMessageRoutes } from './routes/message-routes.ts';
import { registerServiceRoutes } from './routes/service-routes.ts';
import type { HttpServices } from './services.ts';

const REQUEST_ID = /^[\w.-]{1,64}$/;
/** Probes are counted, but logged only at debug level: they come every few seconds. */
const PROBES = new Set(['/livez', '/readyz']);

export function createApp(services: HttpServices): Koa {
  const app = new Koa();
  app.proxy = false;
  app.silent = true;
  app.use(async (ctx, next) => {
    const incoming = ctx.get('X-Request-Id');
    const requestId = REQUEST_ID.test(incoming) ? incoming : randomUUID();
    ctx.state.requestId = requestId;
    ctx.set('X-Request-Id', requestId);
    const started = performance.now();
    ctx.res.once('close', () => answered(ctx, services, started));
    await next();
  });
  app.use(errorMiddleware(services.log, services.databaseUnavailable));
  // RFC 9112 3.2: an HTTP/1.1 request without Host is a 400. Node's own was bodiless (the server lets
  // it through to here: src/daemons/api.ts), this one is the contract's.
  app.use(async (ctx, next) => {
    if (ctx.req.httpVersion === '1.1' && ctx.req.headers.host === undefined) {
      ctx.set('Connection', 'close');
      throw invalidRequest('request', 'An HTTP/1.1 request needs a Host header.');
    }
    await next();
  });
  // Paths as the contract writes them: /v1/inboxes/{id}/EXTEND or a trailing slash is no endpoint
  // (until 2026-11-25 both were served, a paid extend and a deletion-starting download among them).
  const router = new Router({ sensitive: true, strict: true });
  registerServiceRoutes(router, services);
  registerInboxRoutes(router, services);
  registerMessageRoutes(router, services);
  app.use(router.routes());
  app.use(async (ctx) => {
    if (ctx.status === 404 && ctx.body === undefined) throw noEndpoint();
  });
  return app;
}

/** The access log line and the metrics of one request, once its response has ended (or was cut). */
function answered(ctx: Context, services: HttpServices, started: number): void {
  const route = routeOf(ctx);
  const seconds = (performance.now() - started) / 1000;
  const status = ctx.res.statusCode;
  const inboxId =
    typeof ctx.params?.id === 'string' && INBOX_ID.test(ctx.params.id) ? ctx.params.id : undefined;
  services.log({
    ...(PROBES.has(route) ? { level: 'debug' } : {}),
    msg: 'request',
    request_id: ctx.state.requestId,
    method: ctx.method,
    route,
    status,
    ...(inboxId ? { inbox_id: inboxId } : {}),
    ms: Math.round(seconds * 10000) / 10,
    ...(ctx.res.writableFinished ? {} : { aborted: true }),
  });
  services.observe({ method: ctx.method, route, status, seconds });
}
