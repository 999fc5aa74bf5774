/**
 * inbox-route - wraps one inbox operation in contract section 4's check order (core/access.ts):
 * the request's shape is read first but only reported after the credential is known to exist.
 */
import type { Context } from 'koa';
import { type Operation, shapeOf } from '../../core/access.ts';
import type { Caller, Usage } from '../../core/model.ts';
import type { HttpServices } from '../services.ts';

export function inboxRoute<T>(
  services: HttpServices,
  operation: Operation,
  shape: (ctx: Context) => Promise<T> | T,
  run: (caller: Caller, input: T, ctx: Context, usage: Usage | undefined) => Promise<void>,
) {
  return async (ctx: Context): Promise<void> => {
    const shaped = await shapeOf(() => shape(ctx));
    const { caller, input, usage } = await services.access.admit(
      ctx.get('Authorization') || undefined,
      String(ctx.params.id),
      operation,
      shaped,
    );
    ctx.set('Cache-Control', 'no-store');
    await run(caller, input, ctx, usage);
  };
}
