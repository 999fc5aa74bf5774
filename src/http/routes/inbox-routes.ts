/**
 * inbox-routes - provision, status, extend and sender domains (contract section 4).
 */
import type Router from '@koa/router';
import { invalidRequest } from '../../core/errors.ts';
import { normalizeSenderDomains } from '../../core/sender-domains.ts';
import { idempotencyKey, queryParameters, readJsonBody, requireObject } from '../request.ts';
import { ExtendRequest, ProvisionRequest, SenderDomainsRequest } from '../schemas.ts';
import type { HttpServices } from '../services.ts';
import { inboxRoute } from './inbox-route.ts';

export function registerInboxRoutes(router: Router, services: HttpServices): void {
  const { inboxes, optOuts } = services;

  router.post('/v1/inboxes', async (ctx) => {
    inboxes.assertProvisioningOpen();
    queryParameters(ctx, []);
    const body = requireObject(await readJsonBody(ctx), ProvisionRequest);
    const domains = body.sender_domains === undefined ? [] : normalizeSenderDomains(body.sender_domains);
    const key = idempotencyKey(ctx);
    const result = await inboxes.provision(domains, key);
    if (result.replayed) ctx.set('Idempotent-Replayed', 'true');
    ctx.set('Cache-Control', 'no-store');
    ctx.status = 201;
    ctx.body = result.body;
  });

  router.get(
    '/v1/inboxes/:id',
    inboxRoute(
      services,
      { ownerOnly: false, bucket: 'poll', withUsage: true },
      (ctx) => queryParameters(ctx, []),
      async (caller, _input, ctx, usage) => {
        ctx.body = await inboxes.status(caller.inbox, usage);
      },
    ),
  );

  router.post(
    '/v1/inboxes/:id/extend',
    inboxRoute(
      services,
      { ownerOnly: true, bucket: null },
      async (ctx) => {
        queryParameters(ctx, []);
        const body = await readJsonBody(ctx);
        if (body !== undefined) requireObject(body, ExtendRequest);
        return idempotencyKey(ctx);
      },
      async (caller, key, ctx) => {
        const result = await inboxes.extend(caller, key);
        if (result.replayed) ctx.set('Idempotent-Replayed', 'true');
        ctx.body = result.body;
      },
    ),
  );

  router.put(
    '/v1/inboxes/:id/sender-domains',
    inboxRoute(
      services,
      { ownerOnly: true, bucket: 'poll' },
      async (ctx) => {
        queryParameters(ctx, []);
        const body = requireObject(await readJsonBody(ctx), SenderDomainsRequest);
        if (!('sender_domains' in body)) throw missing('sender_domains');
        const domains = normalizeSenderDomains(body.sender_domains);
        // Depends on the request alone, so it comes before the inbox is looked at (contract section 7).
        await optOuts.assertAllowed(domains);
        return domains;
      },
      async (caller, domains, ctx) => {
        ctx.body = await inboxes.setSenderDomains(caller, domains);
      },
    ),
  );
}

const missing = (field: string) => invalidRequest(field, `Field "${field}" is required.`);
