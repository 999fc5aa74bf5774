/**
 * request - reads and checks request parts (step 2 of contract section 4's check order). Every
 * failure is the contract's error body: a body that is not a JSON object, an unknown field, a
 * malformed Idempotency-Key or query parameter is 400 with details.field naming it.
 */
import type { Context } from 'koa';
import type { TObject } from 'typebox';
import { invalidRequest, outOfBounds } from '../core/errors.ts';
import { IDEMPOTENCY_KEY } from '../core/ids.ts';

const MAX_BODY_BYTES = 64 * 1024;

/**
 * The body parsed as JSON whatever its Content-Type (so `curl -d '{}'` works); undefined when empty.
 * A body that is not JSON, or larger than 64 KiB, is invalid_request on field `body`.
 */
export async function readJsonBody(ctx: Context): Promise<unknown> {
  const chunks: Buffer[] = [];
  let size = 0;
  try {
    for await (const chunk of ctx.req as AsyncIterable<Buffer>) {
      size += chunk.length;
      if (size > MAX_BODY_BYTES) {
        // Leaving the loop destroys the request stream, so Node cannot read the rest of the body
        // away: the connection is closed after the answer, not left to parse the rest as a request.
        ctx.set('Connection', 'close');
        throw invalidRequest('body', `The request body is larger than ${MAX_BODY_BYTES} bytes.`);
      }
      chunks.push(chunk);
    }
  } catch (error) {
    if (size > MAX_BODY_BYTES) throw error;
    // The client went away mid-body: its doing, not a failure of ours to log.
    ctx.set('Connection', 'close');
    throw invalidRequest('body', 'The request body was cut off.');
  }
  const text = Buffer.concat(chunks).toString('utf8');
  if (text.trim() === '') return undefined;
  try {
    return JSON.parse(text) as unknown;
  } catch {
    throw invalidRequest('body', 'The request body is not valid JSON.');
  }
}

/** Checks that value is a JSON object holding only the schema's fields; returns it typed loosely. */
export function requireObject(value: unknown, schema: TObject): Record<string, unknown> {
  if (value === undefined) throw invalidRequest('body', 'A JSON object body is required.');
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw invalidRequest('body', 'The request body must be a JSON object.');
  }
  for (const field of Object.keys(value)) {
    // Own properties only: `in` would take `constructor` or `__proto__` for documented fields.
    if (!Object.hasOwn(schema.properties, field)) throw invalidRequest(field, `Unknown field "${field}".`);
  }
  return value as Record<string, unknown>;
}

/** The Idempotency-Key header: undefined when absent, invalid_request when malformed. */
export function idempotencyKey(ctx: Context): string | undefined {
  const value = ctx.get('Idempotency-Key');
  if (value === '' && ctx.headers['idempotency-key'] === undefined) return undefined;
  if (!IDEMPOTENCY_KEY.test(value)) {
    throw invalidRequest(
      'Idempotency-Key',
      'Idempotency-Key must be 1 to 255 printable ASCII characters without spaces.',
    );
  }
  return value;
}

/** The query string's parameters, each at most once and named in `allowed`. */
export function queryParameters(ctx: Context, allowed: readonly string[]): Record<string, string> {
  const params = new URLSearchParams(ctx.querystring);
  const out: Record<string, string> = {};
  for (const [name, value] of params) {
    if (!allowed.includes(name)) throw invalidRequest(name, `Unknown query parameter "${name}".`);
    if (name in out) throw invalidRequest(name, `Query parameter "${name}" is given more than once.`);
    out[name] = value;
  }
  return out;
}

/** The template of the route that served the request (@koa/router sets it), `unmatched` for none. */
export const routeOf = (ctx: Context): string =>
  (ctx as Context & { _matchedRoute?: unknown })._matchedRoute?.toString() ?? 'unmatched';

/** An integer query parameter within bounds: not an integer is invalid_request, outside is out_of_bounds. */
export function integerParameter(
  raw: string | undefined,
  field: string,
  min: number,
  max: number,
  fallback: number,
): number {
  if (raw === undefined) return fallback;
  if (!/^-?\d+$/.test(raw)) throw invalidRequest(field, `${field} must be an integer.`);
  const value = Number(raw);
  // An integer of any length is out of bounds, not "not an integer"; `got` as sent when a number
  // would round it.
  if (!Number.isSafeInteger(value)) throw outOfBounds(field, min, max, raw);
  if (value < min || value > max) throw outOfBounds(field, min, max, value);
  return value;
}
