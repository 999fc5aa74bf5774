/**
 * access - contract section 4's check order, steps 1 and 3 to 6, for every call on an inbox.
 *
 * Step 1 (identify) looks the credential up by hash across all inboxes; step 2 (request shape) is the
 * caller's job between the two calls; authorize then does steps 3 to 6. A missing, malformed, unknown,
 * foreign or purged credential is the same 401 and costs the same single lookup (DESIGN decision 10).
 * A rate bucket is only touched once the credential is proven to be the inbox's own (decision 11).
 */
import type { Clock } from './clock.ts';
import { ServiceError, unauthorized } from './errors.ts';
import { OWNER_CREDENTIAL, READER_CREDENTIAL } from './ids.ts';
import { isPurged, type LifecycleSettings } from './lifecycle.ts';
import type { Caller } from './model.ts';
import type { Bucket, InboxStore, RateLimiter } from './ports.ts';
import { hashCredential } from './secrets.ts';

export interface Operation {
  ownerOnly: boolean;
  bucket: Bucket | null;
}

export class Access {
  readonly #inboxes: InboxStore;
  readonly #limiter: RateLimiter;
  readonly #clock: Clock;
  readonly #settings: LifecycleSettings;

  constructor(inboxes: InboxStore, limiter: RateLimiter, clock: Clock, settings: LifecycleSettings) {
    this.#inboxes = inboxes;
    this.#limiter = limiter;
    this.#clock = clock;
    this.#settings = settings;
  }

  /** Step 1: who is calling. Throws 401 for anything but a credential of an existing inbox. */
  async identify(authorization: string | undefined): Promise<Caller> {
    const token = bearerToken(authorization);
    // Always one lookup, so a malformed token takes as long as an unknown one.
    const found = await this.#inboxes.findByCredential(hashCredential(token));
    const wellFormed = OWNER_CREDENTIAL.test(token) || READER_CREDENTIAL.test(token);
    if (!found || !wellFormed || isPurged(found.inbox, this.#clock.now(), this.#settings))
      throw unauthorized();
    return found;
  }

  /** Steps 3 to 6: the inbox's own credential, not cancelled, allowed, within the rate limit. */
  async authorize(caller: Caller, inboxId: string, operation: Operation): Promise<void> {
    const { inbox } = caller;
    if (inbox.inboxId !== inboxId) throw unauthorized();
    if (inbox.cancelledAt) {
      throw new ServiceError('inbox_cancelled', 'This inbox was cancelled for abuse.', {
        reason: 'abuse',
        cancelled_at: inbox.cancelledAt.toISOString(),
      });
    }
    if (operation.ownerOnly && caller.role !== 'owner') {
      throw new ServiceError('forbidden', 'This operation needs the owner credential.');
    }
    if (operation.bucket) {
      const verdict = await this.#limiter.take(inbox.inboxId, operation.bucket, this.#clock.now());
      if (!verdict.allowed) {
        throw new ServiceError('rate_limited', `Rate limited; retry in ${verdict.retryAfterSeconds} s.`, {
          retry_after_seconds: verdict.retryAfterSeconds,
        });
      }
    }
  }
}

function bearerToken(authorization: string | undefined): string {
  const match = /^Bearer[ ]+(\S+)[ ]*$/i.exec(authorization ?? '');
  return match?.[1] ?? '';
}
