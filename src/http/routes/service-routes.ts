/**
 * service-routes - health and the OpenAPI document; neither takes a credential.
 */
import type Router from '@koa/router';
import { openApiDocument } from '../openapi.ts';
import type { HttpServices } from '../services.ts';

export function registerServiceRoutes(router: Router, services: HttpServices): void {
  router.get('/v1/health', (ctx) => {
    ctx.body = { ok: true, environment: services.environment };
  });
  const document = openApiDocument();
  router.get('/v1/openapi.json', (ctx) => {
    ctx.body = document;
  });
}
