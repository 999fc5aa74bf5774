/**
 * error-middleware - the only place that knows HTTP statuses (STYLE 5). A ServiceError becomes the
 * contract's error body with its status and headers; anything else is logged with the request id
 * and answered `500 internal`, with no detail for the peer.
 *
 * While the database is away (or this host's clock is off PostgreSQL's) every request fails the same
 * way: such a failure is logged without its stack, and only the first in each UNAVAILABLE_LOG_MS per
 * cause; the next line says how many were left out (the crash soak saw about 400 lines with stacks
 * in a few seconds of outage).
 */
import type { Context, Next } from 'koa';
import { ClockSkewError } from '../core/clock-check.ts';
import { type ErrorCode, ServiceError } from '../core/errors.ts';
import { routeOf } from './request.ts';

export const STATUS: Record<ErrorCode, number> = {
  unauthorized: 401,
  forbidden: 403,
  not_found: 404,
  inbox_not_found: 404,
  message_not_found: 404,
  message_gone: 410,
  inbox_cancelled: 410,
  inbox_expired: 409,
  idempotency_conflict: 409,
  sender_opted_out: 409,
  invalid_request: 400,
  out_of_bounds: 400,
  range_not_satisfiable: 416,
  rate_limited: 429,
  internal: 500,
};

export type Logger = (line: Record<string, unknown>) => void;

export const UNAVAILABLE_LOG_MS = 10_000;

export function errorMiddleware(log: Logger, databaseUnavailable: (error: unknown) => boolean = () => false) {
  // Per cause, so that one does not hide the other's line.
  const lastLog = new Map<string, number>();
  const leftOut = new Map<string, number>();
  const logInternal = (line: Record<string, unknown>, caught: unknown) => {
    // This host's clock disagreeing with PostgreSQL's (core/clock-check.ts) fails every request alike too.
    const cause =
      caught instanceof ClockSkewError
        ? 'clock'
        : databaseUnavailable(caught)
          ? 'database unavailable'
          : null;
    if (cause === null) {
      log({ ...line, error: caught instanceof Error ? caught.stack : String(caught) });
      return;
    }
    const now = performance.now();
    if (now - (lastLog.get(cause) ?? Number.NEGATIVE_INFINITY) < UNAVAILABLE_LOG_MS) {
      leftOut.set(cause, (leftOut.get(cause) ?? 0) + 1);
      return;
    }
    lastLog.set(cause, now);
    log({ ...line, cause, error: String(caught), left_out: leftOut.get(cause) ?? 0 });
    leftOut.set(cause, 0);
  };
  return async (ctx: Context, next: Next): Promise<void> => {
    try {
      await next();
    } catch (caught) {
      const error = toServiceError(caught, ctx, logInternal);
      ctx.status = STATUS[error.code];
      ctx.set('Cache-Control', 'no-store');
      if (error.code === 'rate_limited') ctx.set('Retry-After', String(error.details?.retry_after_seconds));
      if (error.code === 'range_not_satisfiable')
        ctx.set('Content-Range', `bytes */${error.details?.size_bytes}`);
      ctx.body = {
        error: {
          code: error.code,
          message: error.message,
          ...(error.details ? { details: error.details } : {}),
        },
      };
    }
  };
}

function toServiceError(
  caught: unknown,
  ctx: Context,
  log: (line: Record<string, unknown>, caught: unknown) => void,
): ServiceError {
  if (caught instanceof ServiceError) return caught;
  // Koa's own client errors (a malformed URL, say) are the client's fault, not ours.
  const status = (caught as { status?: unknown }).status;
  if (
    typeof status === 'number' &&
    status >= 400 &&
    status < 500 &&
    (caught as { expose?: boolean }).expose
  ) {
    return new ServiceError('invalid_request', (caught as Error).message, { field: 'request' });
  }
  log(
    {
      level: 'error',
      msg: 'internal error',
      request_id: ctx.state.requestId,
      method: ctx.method,
      route: routeOf(ctx),
    },
    caught,
  );
  return new ServiceError('internal', `Internal error; request id ${ctx.state.requestId}.`);
}
