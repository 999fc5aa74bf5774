/**
 * inbox-route - runs contract section 4's check order around one inbox operation:
 * identify (401) → request shape (400/404/409) → own inbox (401) → cancelled (410) → role (403) →
 * rate limit (429) → the operation.
 */
import type { Context } from 'koa';
import type { Operation } from '../../core/access.ts';
import type { Caller } from '../../core/model.ts';
import type { HttpServices } from '../services.ts';

export function inboxRoute<T>(
  services: HttpServices,
  operation: Operation,
  shape: (ctx: Context) => Promise<T> | T,
  run: (caller: Caller, input: T, ctx: Context) => Promise<void>,
) {
  return async (ctx: Context): Promise<void> => {
    const caller = await services.access.identify(ctx.get('Authorization') || undefined);
    const input = await shape(ctx);
    await services.access.authorize(caller, String(ctx.params.id), operation);
    ctx.set('Cache-Control', 'no-store');
    await run(caller, input, ctx);
  };
}
