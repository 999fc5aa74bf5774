/**
 * milter-check - what the milter does with one message (DESIGN decisions 2, 4 and 6): rebuild the
 * message as the sender sent it, authenticate it with mailauth while the body streams in, let the core
 * decide at end of data, and on accept remove forged Authentication-Results fields that claim our
 * authserv-id (RFC 8601 section 5) and insert ours at the top.
 *
 * Memory: the body is handed to mailauth as it arrives, with backpressure; nothing holds the message.
 * A body no signature covers is only counted (Authenticator.readsBody): mailauth gets the headers alone.
 * Signatures beyond what signature-limits.ts lets through are not given to mailauth at all.
 */
import { once } from 'node:events';
import { PassThrough } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { claimsAuthservId } from '../core/authentication-results.ts';
import type { MessageAdmission } from '../core/message-admission.ts';
import type { Authenticator, AuthVerdict } from '../core/ports.ts';
import type { Decision } from '../core/reservation-ledger.ts';
import type {
  HeaderEdits,
  MessageConsumer,
  MilterEnvelope,
  MilterHandler,
  MilterHeader,
} from '../milter/handler.ts';
import { LOCK_TIMEOUT_MS } from '../storage/database.ts';
import { verifiableHeaders } from './signature-limits.ts';

const AUTH_RESULTS = 'authentication-results';

/**
 * The waits between attempts to withdraw the reservations of an accept the MTA never heard (ms; about
 * ten minutes in all). It most often fails because PostgreSQL went away, which is also what lost the
 * answer: tried once, the reservation stayed until the clean-up job (RESERVATION_TTL_SECONDS, six days)
 * and turned the sender's retry into a quota refusal. Withdrawing is idempotent (only rows still in
 * flight go, and Postfix queued nothing under their queue id).
 */
export const WITHDRAW_RETRY_MS: readonly number[] = [
  1_000, 2_000, 5_000, 10_000, 30_000, 60_000, 120_000, 300_000,
];

/**
 * How long after a reservation call that failed its statement may still commit (ms): the connection
 * can break while PostgreSQL's backend waits for the inbox row's lock (lock_timeout, LOCK_TIMEOUT_MS)
 * or runs; the backend does not notice the lost client and commits afterwards. A withdrawal made at
 * once then found nothing, and the reservation committed after it held its bytes until the clean-up
 * job, six days later (a retry could meet `555 mailbox quota exceeded`). So the reservations of a
 * call that failed are withdrawn again this long after, with their decision kept open meanwhile (its
 * keys stay in the heartbeat: if this process dies first, the orphan sweep takes them). This long per
 * inbox of the reservation: its statement locks each in turn, and may wait lock_timeout for each. A
 * statement that runs longer still (there is no statement_timeout) is left to the clean-up job.
 */
export const RESERVATION_SETTLE_MS = 2 * LOCK_TIMEOUT_MS + 10_000;

export class MilterCheck implements MilterHandler {
  readonly #admission: MessageAdmission;
  readonly #authenticator: Authenticator;
  readonly #authservId: string;
  readonly #withdrawRetryMs: readonly number[];
  readonly #settleMs: number;

  constructor(
    admission: MessageAdmission,
    authenticator: Authenticator,
    authservId: string,
    withdrawRetryMs = WITHDRAW_RETRY_MS,
    settleMs = RESERVATION_SETTLE_MS,
  ) {
    this.#admission = admission;
    this.#authenticator = authenticator;
    this.#authservId = authservId.toLowerCase();
    this.#withdrawRetryMs = withdrawRetryMs;
    this.#settleMs = settleMs;
  }

  beginMessage(envelope: MilterEnvelope, headers: MilterHeader[]): MessageConsumer {
    // The reservation and the receiver's idempotency are keyed on it: without it, fail (4xx), never
    // reserve under an empty id. It comes with the DATA macros (postfix/main.cf milter_data_macros).
    if (!envelope.queueId) throw new Error('no queue id from the MTA: milter_data_macros must include i');
    const headerBlock = blockOf(headers);
    let sizeBytes = headerBlock.length;
    const verified = verifiableHeaders(headers);
    const readsBody = this.#authenticator.readsBody(verified.map((h) => h.name));
    const stream = new PassThrough();
    const auth: Promise<AuthVerdict> = this.#authenticator.authenticate({
      message: stream,
      clientAddress: envelope.clientAddress,
      helo: envelope.helo,
      envelopeFrom: envelope.envelopeFrom,
    });
    // Settles only if authentication fails: a body chunk waiting for room then fails instead of
    // waiting forever. Both are observed later (end(), body()); neither may go unhandled meanwhile.
    const obsoleteDomain = headers.some(
      (h) => h.name.toLowerCase() === 'from' && OBSOLETE_DOMAIN.test(h.value),
    );
    const failed = auth.then(() => new Promise<never>(() => {}));
    auth.catch(() => {});
    failed.catch(() => {});
    stream.write(verified === headers ? headerBlock : blockOf(verified));
    // Nothing more to give: mailauth may work (DNS, DMARC) while the body is still arriving.
    if (!readsBody) stream.end();
    let decision: Decision | undefined;
    /** The reservation call failed: its statement may still commit (RESERVATION_SETTLE_MS). */
    let unsettled = false;

    return {
      body: async (chunk) => {
        sizeBytes += chunk.length;
        if (readsBody && !stream.write(chunk)) await Promise.race([once(stream, 'drain'), failed]);
      },
      end: async () => {
        if (readsBody) stream.end();
        const verdict = await auth.then((v) => (obsoleteDomain ? { ...v, unverifiableAuthor: true } : v));
        // Open from before the reservation until the answer reached the MTA or it was withdrawn
        // (core/reservation-ledger.ts): a process that dies meanwhile leaves it to the orphan sweep.
        decision = this.#admission.open(envelope.recipients);
        let outcome: Awaited<ReturnType<MessageAdmission['admit']>>;
        try {
          outcome = await this.#admission.admit(
            {
              queueId: envelope.queueId,
              envelopeFrom: envelope.envelopeFrom,
              recipients: envelope.recipients,
              sizeBytes,
              internetMessageId: firstValue(headers, 'message-id'),
              auth: verdict,
              trace: {
                helo: envelope.helo,
                clientName: envelope.clientName,
                clientAddress: envelope.clientAddress,
              },
            },
            decision,
          );
        } catch (error) {
          unsettled = true;
          throw error;
        }
        // A refusal reserved nothing (the reservation is all or none, and the last step).
        if (outcome.kind !== 'accept') decision.close();
        return { verdict: outcome, edits: this.#edits(headers, verdict) };
      },
      abort: () => {
        stream.destroy();
      },
      delivered: () => decision?.close(),
      undelivered: async () => {
        // Closed only once withdrawn: if this process dies first, its heartbeat names these keys, and
        // the orphan sweep releases them (orphan-sweep.ts).
        const withdraw = () => this.#admission.withdraw(decision?.keys ?? []);
        await this.#retried(withdraw);
        if (unsettled) {
          // The statement may wait for each inbox's lock in turn (lock_timeout applies to each wait).
          const inboxes = new Set(decision?.keys.map((key) => key.inboxId)).size;
          await sleep(this.#settleMs * Math.max(1, inboxes), undefined, { ref: false });
          await this.#retried(withdraw);
        }
        decision?.close();
      },
    };
  }

  /** Runs `attempt` until it goes through, #withdrawRetryMs apart; the last failure throws. */
  async #retried(attempt: () => Promise<unknown>): Promise<void> {
    for (const wait of this.#withdrawRetryMs) {
      try {
        await attempt();
        return;
      } catch {
        // Pending timers must not hold a stopping process open: what is left then is the job's.
        await sleep(wait, undefined, { ref: false });
      }
    }
    await attempt();
  }

  /** Delete every Authentication-Results field claiming our authserv-id, then insert ours at the top. */
  #edits(headers: MilterHeader[], auth: AuthVerdict): HeaderEdits {
    const forged: { name: string; index: number }[] = [];
    let index = 0;
    for (const header of headers) {
      if (header.name.toLowerCase() !== AUTH_RESULTS) continue;
      index++;
      if (claimsAuthservId(header.value, this.#authservId)) forged.push({ name: header.name, index });
    }
    return {
      delete: forged,
      insert: [{ index: 0, name: 'Authentication-Results', value: auth.headerValue }],
    };
  }
}

/**
 * A `From:` address whose domain has white space or a comment around a dot (RFC 5322 4.4's obsolete
 * syntax, `ceo@strict .test`, `ceo@strict.(x)test`): mailauth reads the domain as `strict`, while a mail
 * reader shows `strict.test`, so DMARC and the opt-outs checked another domain than the one shown
 * (until 2026-11-25 such mail from a `p=reject` domain was delivered). Refused as failing DMARC.
 */
const OBSOLETE_DOMAIN =
  /@[^\s@,;:<>()"[\]]*(?:[^\s@,;:<>()"[\].](?:[ \t\r\n]|\([^()]*\))+\.|\.(?:[ \t\r\n]|\([^()]*\))+[^\s@,;:<>()"[\].])/;

/** The header fields as the sender sent them, and the blank line after them. */
function blockOf(headers: MilterHeader[]): Buffer {
  return Buffer.concat([
    ...headers.map((h) => Buffer.from(`${h.name}:${h.value.replace(/\r?\n/g, '\r\n')}\r\n`, 'latin1')),
    Buffer.from('\r\n'),
  ]);
}

/**
 * The first field's value, unfolded and trimmed; null when absent or empty, as the receiver's summary
 * reads it: retries are one rejection event per Message-ID, and unrelated messages each with an empty
 * `Message-ID:` were one event (until 2026-11-25).
 */
function firstValue(headers: MilterHeader[], name: string): string | null {
  const header = headers.find((h) => h.name.toLowerCase() === name);
  return header?.value.replace(/\r?\n[ \t]+/g, ' ').trim() || null;
}
