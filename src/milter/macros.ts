/**
 * macros - the Sendmail macros Postfix sends before events (SMFIC_MACRO), kept per stage.
 *
 * Each SMFIC_MACRO replaces the macros of its stage, as libmilter does. The stages of a transaction
 * (MAIL through end of message) are forgotten when it ends, so no value of one message (its queue id `i`,
 * `{rcpt_addr}`, ...) is seen with the next; connection stages (CONNECT, HELO) stay.
 */

import { MACRO_STAGES } from './codec.ts';

const TRANSACTION_STAGES = ['M', 'R', 'T', 'L', 'N', 'B', 'E'];

export class MacroStore {
  readonly #stages = new Map<string, Map<string, string>>();

  set(stage: string, macros: [string, string][]): void {
    this.#stages.set(stage, new Map(macros));
  }

  /** Forgets the transaction stages' macros; `keep` names one to spare (MAIL's arrive before MAIL). */
  endTransaction(keep?: string): void {
    for (const stage of TRANSACTION_STAGES) if (stage !== keep) this.#stages.delete(stage);
  }

  clear(): void {
    this.#stages.clear();
  }

  /** All macros, merged in the order Postfix sends the stages (MACRO_STAGES): a later stage's value wins. */
  snapshot(): Map<string, string> {
    const merged = new Map<string, string>();
    for (const stage of MACRO_STAGES) {
      for (const [name, value] of this.#stages.get(stage) ?? []) merged.set(name, value);
    }
    return merged;
  }
}
