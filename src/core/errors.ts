/**
 * errors - the one error catalog of contract section 7.
 *
 * The core throws ServiceError with a contract code and optional details; only the HTTP error middleware
 * knows which status each code maps to. Anything else thrown is an internal failure.
 */
export type ErrorCode =
  | 'unauthorized'
  | 'forbidden'
  | 'not_found'
  | 'inbox_not_found'
  | 'message_not_found'
  | 'message_gone'
  | 'inbox_cancelled'
  | 'inbox_expired'
  | 'idempotency_conflict'
  | 'sender_opted_out'
  | 'invalid_request'
  | 'out_of_bounds'
  | 'range_not_satisfiable'
  | 'rate_limited'
  | 'internal';

export type ErrorDetails = Record<string, unknown>;

export class ServiceError extends Error {
  readonly code: ErrorCode;
  readonly details: ErrorDetails | undefined;
  constructor(code: ErrorCode, message: string, details?: ErrorDetails) {
    super(message);
    this.code = code;
    this.details = details;
  }
}

export const unauthorized = (): ServiceError =>
  new ServiceError('unauthorized', 'Missing, malformed or unknown credential for this inbox.');

export const invalidRequest = (field: string, message: string): ServiceError =>
  new ServiceError('invalid_request', message, { field });

export const outOfBounds = (field: string, min: number, max: number, got: unknown): ServiceError =>
  new ServiceError('out_of_bounds', `${field} must be between ${min} and ${max}.`, { field, min, max, got });

/** 410 inbox_cancelled, for any call on a cancelled inbox (contract section 3). */
export function inboxCancelled(cancelledAt: Date): ServiceError {
  return new ServiceError('inbox_cancelled', 'This inbox was cancelled for abuse.', {
    reason: 'abuse',
    cancelled_at: cancelledAt.toISOString(),
  });
}

/** 404 not_found: a path, or a method on it, that no endpoint serves. */
export const noEndpoint = (): ServiceError => new ServiceError('not_found', 'No endpoint serves this path.');
