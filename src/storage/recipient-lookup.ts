/**
 * recipient-lookup - the policy daemon's read at RCPT: the recipient's inbox settings and which of the
 * sender's domain names are opted out (RecipientLookup), kept in memory between RCPTs.
 *
 * Kept exactly, not for a time: an inbox's entry is dropped when PostgreSQL announces a change to its
 * settings or its deletion, everything when an opt-out changes (InboxChangeFeed). Nothing is kept while
 * the feed is not listening, and a read is kept only if no announcement arrived while it was in flight
 * (a generation count), so no entry is older than the last announcement this process received. What
 * remains is an announcement's own delay: a change committed elsewhere reaches this process a moment
 * later, and a RCPT answered in that moment sees the state just before the commit. The milter reads
 * fresh at end of data (MessageAdmission) and refuses a cancelled or expired inbox's message there.
 *
 * An inbox that was not found is not kept: new inboxes are not announced. Usage is never kept: the
 * policy daemon reads it with InboxStore.findForDelivery whenever a decision needs it.
 */
import { BoundedMap } from '../core/bounded-map.ts';
import type { InboxSettings } from '../core/model.ts';
import type { RecipientLookup, RecipientTarget } from '../core/ports.ts';
import type { Database } from './database.ts';
import type { ChangeSubscriber } from './inbox-changes.ts';
import { INBOX_SETTINGS_COLUMNS, type InboxSettingsRow, OPTED_OUT_AMONG, toInboxSettings } from './rows.ts';

export class PgRecipientLookup implements RecipientLookup, ChangeSubscriber {
  readonly #db: Database;
  readonly #inboxes: BoundedMap<string, InboxSettings>;
  /** Per domain name asked about: whether it is in the opt-out registry. */
  readonly #optOuts: BoundedMap<string, boolean>;
  #generation = 0;
  #listening = false;

  constructor(db: Database, maxEntries = 20_000) {
    this.#db = db;
    this.#inboxes = new BoundedMap(maxEntries);
    this.#optOuts = new BoundedMap(maxEntries);
  }

  changed(what: string): void {
    this.#generation++;
    if (what === '*') this.#forget();
    else this.#inboxes.delete(what);
  }

  listening(up: boolean): void {
    this.#generation++;
    this.#listening = up;
    this.#forget();
  }

  async find(inboxId: string, senderDomains: string[]): Promise<RecipientTarget | undefined> {
    const inbox = this.#inboxes.get(inboxId);
    const optedOut = inbox ? this.#knownOptOuts(senderDomains) : undefined;
    if (inbox && optedOut) return { inbox, optedOut };

    const generation = this.#generation;
    const [row] = await this.#db.rows<InboxSettingsRow & { opted_out: string[] }>(
      'inbox-for-recipient',
      `SELECT ${INBOX_SETTINGS_COLUMNS}, ${OPTED_OUT_AMONG('$2')} AS opted_out
       FROM inboxes i WHERE i.inbox_id = $1`,
      [inboxId, senderDomains],
    );
    if (!row) return undefined;
    const found: RecipientTarget = { inbox: toInboxSettings(row), optedOut: row.opted_out };
    if (this.#listening && generation === this.#generation) {
      this.#inboxes.set(inboxId, found.inbox);
      for (const name of senderDomains) this.#optOuts.set(name, row.opted_out.includes(name));
    }
    return found;
  }

  /** The opted-out names among `names` if every one of them is known, else undefined. */
  #knownOptOuts(names: string[]): string[] | undefined {
    const optedOut: string[] = [];
    for (const name of names) {
      const known = this.#optOuts.get(name);
      if (known === undefined) return undefined;
      if (known) optedOut.push(name);
    }
    return optedOut;
  }

  #forget(): void {
    this.#inboxes.clear();
    this.#optOuts.clear();
  }
}
