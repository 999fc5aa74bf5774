/**
 * milter-check-over - a MilterCheck over the real admission rules of a test harness, for tests that
 * call MilterCheck directly (no milter protocol, no Postfix): mailauth answers from the test zone, the
 * store may be the harness's own or one with a method replaced (storeWith), and the reservations may
 * name a ledger (core/reservation-ledger.ts).
 */
import { TOKENS } from '../../src/container.ts';
import { MessageAdmission } from '../../src/core/message-admission.ts';
import type { DeliverySummary, MessageStore } from '../../src/core/ports.ts';
import type { ReservationLedger } from '../../src/core/reservation-ledger.ts';
import type { CachingLookup } from '../../src/mail/dns.ts';
import { MailauthAuthenticator } from '../../src/mail/mailauth-authenticator.ts';
import { MilterCheck } from '../../src/mail/milter-check.ts';
import { resolveInZone } from './dns-zone.ts';
import type { Harness } from './harness.ts';

/** A delivery's summary when nothing in it matters. */
export const NO_SUMMARY: DeliverySummary = {
  fromName: null,
  fromAddress: null,
  subject: null,
  internetMessageId: null,
  authentication: null,
};

export interface MilterCheckOptions {
  store?: MessageStore;
  ledger?: ReservationLedger;
  withdrawRetryMs?: readonly number[];
  /** RESERVATION_SETTLE_MS for this check (a failed reservation call is withdrawn again after it). */
  settleMs?: number;
}

export function milterCheckOver(h: Harness, options: MilterCheckOptions = {}): MilterCheck {
  const admission = new MessageAdmission(
    h.container.resolve(TOKENS.InboxStore),
    options.store ?? h.messages,
    h.clock,
    h.container.resolve(TOKENS.SmtpReplies),
    h.config,
    options.ledger ?? null,
  );
  return new MilterCheck(
    admission,
    new MailauthAuthenticator(h.config.authservId, { resolve: resolveInZone } as unknown as CachingLookup),
    h.config.authservId,
    options.withdrawRetryMs,
    options.settleMs,
  );
}

/** The harness's message store with one method replaced, as a lossy connection or an outage makes it. */
export function storeWith<K extends keyof MessageStore>(
  h: Harness,
  name: K,
  replace: (target: MessageStore) => MessageStore[K],
): MessageStore {
  return new Proxy(h.messages, {
    get(target, key) {
      if (key === name) return replace(target);
      const value = Reflect.get(target, key);
      return typeof value === 'function' ? value.bind(target) : value;
    },
  });
}
