/**
 * clock - the only source of "now" for the core and storage.
 *
 * Every time rule (expiry, delete_after, idempotency TTL, rate buckets) is evaluated against this clock,
 * never against the database's now(), so tests can move time without sleeping.
 */
export interface Clock {
  now(): Date;
}

export const systemClock: Clock = { now: () => new Date() };

export const addSeconds = (at: Date, seconds: number): Date => new Date(at.getTime() + seconds * 1000);
