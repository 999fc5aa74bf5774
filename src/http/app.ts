/**
 * app - the Koa application: request id, error mapping, the /v1 routes, and 404 not_found for any
 * path no endpoint serves.
 */
import { randomUUID } from 'node:crypto';
import Router from '@koa/router';
import Koa from 'koa';
import { ServiceError } from '../core/errors.ts';
import { errorMiddleware } from './error-middleware.ts';
import { registerInboxRoutes } from './routes/inbox-routes.ts';
import { registerMessageRoutes } from './routes/message-routes.ts';
import { registerServiceRoutes } from './routes/service-routes.ts';
import type { HttpServices } from './services.ts';

export function createApp(services: HttpServices): Koa {
  const app = new Koa();
  app.proxy = false;
  app.silent = true;
  app.use(async (ctx, next) => {
    const requestId = /^[\w.-]{1,64}$/.test(ctx.get('X-Request-Id')) ? ctx.get('X-Request-Id') : randomUUID();
    ctx.state.requestId = requestId;
    ctx.set('X-Request-Id', requestId);
    await next();
  });
  app.use(errorMiddleware(services.log));
  const router = new Router();
  registerServiceRoutes(router, services);
  registerInboxRoutes(router, services);
  registerMessageRoutes(router, services);
  app.use(router.routes());
  app.use(async (ctx) => {
    if (ctx.status === 404 && ctx.body === undefined)
      throw new ServiceError('not_found', 'No endpoint serves this path.');
  });
  return app;
}
