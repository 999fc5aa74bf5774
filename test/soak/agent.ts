/**
 * agent - one inbox's agent in the crash soak, as the contract recommends it: poll, download every
 * message listed, follow `next_url` until `has_more` is false, wait, poll `next_url` again. The API
 * process may be killed under it: a request that fails to connect or is cut off is repeated as it was
 * (the cursor has not moved), a 429 waits its Retry-After, a 5xx is counted and repeated.
 *
 * What it records for the checks: each message listed, with every poll URL (cursor position) that
 * listed it (a message listed from two positions was listed twice: contract poll rule 4), and each
 * download whose bytes do not end with the bytes sent.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { bareMessageId } from './soak-mail.ts';

interface Summary {
  message_id: string;
  url: string;
  internet_message_id: string | null;
}

interface PollBody {
  messages: Summary[];
  next_url: string;
  has_more: boolean;
}

export class Agent {
  /** message_id -> the poll URLs that listed it. */
  readonly listed = new Map<string, Set<string>>();
  readonly downloaded = new Set<string>();
  readonly wrongBytes: string[] = [];
  /** Answers nobody should get (a 404 or 410 for a listed message, a 400 for a cursor we were given). */
  readonly unexpected: string[] = [];
  serverErrors = 0;
  connectionErrors = 0;
  #stopping = false;
  #done: Promise<void> | undefined;

  readonly inboxId: string;
  readonly #token: string;
  readonly #apiBase: string;
  /** The bytes sent with this Message-ID (without angle brackets), if the soak sent it. */
  readonly #sent: (messageId: string) => Buffer | undefined;

  constructor(
    inboxId: string,
    token: string,
    apiBase: string,
    sent: (messageId: string) => Buffer | undefined,
  ) {
    this.inboxId = inboxId;
    this.#token = token;
    this.#apiBase = apiBase;
    this.#sent = sent;
  }

  start(): void {
    this.#done = this.#run();
  }

  /** Resolves once a poll that began after this call said `has_more: false`, and all is downloaded. */
  async stop(): Promise<void> {
    this.#stopping = true;
    await this.#done;
  }

  async #run(): Promise<void> {
    let url = `${this.#apiBase}/v1/inboxes/${this.inboxId}/messages?limit=50`;
    for (;;) {
      const stopAsked = this.#stopping;
      const response = await this.#request(url);
      if (response === undefined) continue;
      if (response.status !== 200) {
        this.unexpected.push(`poll ${response.status} ${await response.text()}`);
        await sleep(500);
        continue;
      }
      const body = (await response.json()) as PollBody;
      for (const message of body.messages) {
        const urls = this.listed.get(message.message_id) ?? new Set<string>();
        urls.add(url);
        this.listed.set(message.message_id, urls);
        if (!this.downloaded.has(message.message_id)) await this.#download(message);
      }
      url = body.next_url;
      if (!body.has_more) {
        if (stopAsked) return;
        await sleep(300);
      }
    }
  }

  async #download(message: Summary): Promise<void> {
    for (;;) {
      const response = await this.#request(message.url);
      if (response === undefined) continue;
      let bytes: Buffer;
      try {
        bytes = Buffer.from(await response.arrayBuffer());
      } catch {
        this.connectionErrors++; // cut off mid-body: inside the deletion window a retry is allowed
        continue;
      }
      if (response.status !== 200) {
        this.unexpected.push(`download ${message.message_id} ${response.status} ${bytes.toString()}`);
        return;
      }
      const id = bareMessageId(message.internet_message_id);
      const sent = this.#sent(id);
      if (!sent || !bytes.subarray(Math.max(0, bytes.length - sent.length)).equals(sent)) {
        this.wrongBytes.push(`${message.message_id} (${id})`);
      }
      this.downloaded.add(message.message_id);
      return;
    }
  }

  /** One request; undefined when it should simply be repeated (after a pause). */
  async #request(url: string): Promise<Response | undefined> {
    let response: Response;
    try {
      response = await fetch(url, { headers: { authorization: `Bearer ${this.#token}` } });
    } catch {
      this.connectionErrors++;
      await sleep(200);
      return undefined;
    }
    if (response.status === 429) {
      await response.arrayBuffer().catch(() => undefined);
      await sleep(Number(response.headers.get('retry-after') ?? 1) * 1000);
      return undefined;
    }
    if (response.status >= 500) {
      this.serverErrors++;
      await response.arrayBuffer().catch(() => undefined);
      await sleep(200);
      return undefined;
    }
    return response;
  }
}
