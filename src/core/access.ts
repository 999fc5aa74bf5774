/**
 * access - contract section 4's check order for every call on an inbox:
 *   1. credential missing, malformed or unknown → 401
 *   2. request shape → 400 (404 for a malformed message id; 409 for an opted-out sender domain)
 *   3. credential not the inbox's own → 401
 *   4. inbox cancelled → 410
 *   5. role may not do this → 403
 *   6. rate limit → 429
 * Steps 1 and 3 to 6 cost one store round trip (Gatekeeper.admit), taken after the request's shape is
 * known, so only a well-formed request by the inbox's own credential can consume a rate token.
 * Missing, malformed, unknown, foreign and purged credentials are the same 401 and cost the same single
 * lookup (DESIGN decision 10); purged means past the purge delay, whether or not a job has run.
 */
import type { Clock } from './clock.ts';
import { addSeconds } from './clock.ts';
import { inboxCancelled, ServiceError, unauthorized } from './errors.ts';
import { INBOX_ID, OWNER_CREDENTIAL, READER_CREDENTIAL } from './ids.ts';
import { isPurged, type LifecycleSettings, usageInstant } from './lifecycle.ts';
import type { Caller, Usage } from './model.ts';
import type { Bucket, Gatekeeper } from './ports.ts';
import { hashCredential } from './secrets.ts';
import { UsageCache } from './usage-cache.ts';

export interface Operation {
  ownerOnly: boolean;
  bucket: Bucket | null;
  /** Also return the inbox's usage (status and poll need it), from the cache or the same round trip. */
  withUsage?: boolean;
}

export type Shape<T> = { ok: true; value: T } | { ok: false; error: unknown };

export interface Admitted<T> {
  caller: Caller;
  input: T;
  usage: Usage | undefined;
}

export class Access {
  readonly #gate: Gatekeeper;
  readonly #clock: Clock;
  readonly #settings: LifecycleSettings;
  readonly #usage: UsageCache;

  constructor(gate: Gatekeeper, clock: Clock, settings: LifecycleSettings, usage = new UsageCache()) {
    this.#gate = gate;
    this.#clock = clock;
    this.#settings = settings;
    this.#usage = usage;
  }

  /** Runs the six checks; `shape` is step 2's outcome, computed by the caller without side effects. */
  async admit<T>(
    authorization: string | undefined,
    inboxId: string,
    operation: Operation,
    shape: Shape<T>,
  ): Promise<Admitted<T>> {
    const token = bearerToken(authorization);
    const wellFormed = OWNER_CREDENTIAL.test(token) || READER_CREDENTIAL.test(token);
    // A path id that is no inbox id (a NUL, which Postgres text refuses, among them) names no inbox:
    // the lookup goes ahead with an id nothing has, and the answer is the unknown inbox's 401.
    const pathId = INBOX_ID.test(inboxId) ? inboxId : '';
    const now = this.#clock.now();
    const withUsage = operation.withUsage === true && shape.ok;
    const known = withUsage ? this.#usage.peek(pathId, now) : undefined;
    // Always one lookup, so a malformed token takes as long as an unknown one.
    const admission = await this.#gate.admit({
      credentialHash: hashCredential(token),
      inboxId: pathId,
      ownerOnly: operation.ownerOnly,
      bucket: operation.bucket,
      take: shape.ok && wellFormed,
      withUsage,
      knownUsageVersion: known?.version ?? null,
      now,
      purgeCutoff: addSeconds(now, -this.#settings.purgeAfterSeconds),
    });
    if (!admission || !wellFormed || isPurged(admission.inbox, now, this.#settings)) throw unauthorized();
    if (!shape.ok) throw shape.error;
    const { inbox, role } = admission;
    if (inbox.inboxId !== pathId) throw unauthorized();
    if (inbox.cancelledAt) throw inboxCancelled(inbox.cancelledAt);
    if (operation.ownerOnly && role !== 'owner')
      throw new ServiceError('forbidden', 'This operation needs the owner credential.');
    if (operation.bucket) {
      if (admission.bucket === 'refused') {
        const seconds = admission.retryAfterSeconds ?? 1;
        throw new ServiceError('rate_limited', `Rate limited; retry in ${seconds} s.`, {
          retry_after_seconds: seconds,
        });
      }
      if (admission.bucket !== 'taken')
        throw new Error('gatekeeper skipped the rate bucket of an admitted request');
    }
    let usage: Usage | undefined;
    if (withUsage) {
      if (admission.usage) {
        const { changesAt, ...counts } = admission.usage;
        usage = counts;
        this.#usage.remember(
          inbox.inboxId,
          inbox.version,
          counts,
          changesAt,
          inbox.expiresAt,
          usageInstant(inbox, now),
        );
      } else if (known && known.version === inbox.version) usage = known.usage;
      else throw new Error('gatekeeper returned no usage for an inbox whose usage is not known');
    }
    return { caller: { role, inbox }, input: shape.value, usage };
  }
}

/** Step 2 as a value: a ServiceError thrown while reading the request is kept for after step 1. */
export async function shapeOf<T>(read: () => Promise<T> | T): Promise<Shape<T>> {
  try {
    return { ok: true, value: await read() };
  } catch (error) {
    if (error instanceof ServiceError) return { ok: false, error };
    throw error;
  }
}

function bearerToken(authorization: string | undefined): string {
  const match = /^Bearer[ ]+(\S+)[ ]*$/i.exec(authorization ?? '');
  return match?.[1] ?? '';
}
