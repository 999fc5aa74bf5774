/**
 * service-routes - health, the OpenAPI document and the probes; none takes a credential.
 *
 * `GET /v1/health` is the contract's (section 9). `GET /livez` and `GET /readyz` are for operators
 * and orchestrators, outside /v1 and outside the OpenAPI document: live while the process answers;
 * ready (200) when the database answers `SELECT 1` and the clock agrees with PostgreSQL's (and, under
 * `all`, our Postfix runs), else 503 (src/ops/health.ts, src/core/clock-check.ts).
 */
import type Router from '@koa/router';
import { openApiDocument } from '../openapi.ts';
import type { HttpServices } from '../services.ts';

export function registerServiceRoutes(router: Router, services: HttpServices): void {
  router.get('/v1/health', (ctx) => {
    ctx.body = { ok: true, environment: services.environment };
  });
  router.get('/livez', (ctx) => {
    ctx.set('Cache-Control', 'no-store');
    ctx.body = { ok: true };
  });
  router.get('/readyz', async (ctx) => {
    const readiness = await services.health.ready();
    ctx.set('Cache-Control', 'no-store');
    ctx.status = readiness.ok ? 200 : 503;
    ctx.body = readiness;
  });
  const document = openApiDocument();
  router.get('/v1/openapi.json', (ctx) => {
    ctx.body = document;
  });
}
