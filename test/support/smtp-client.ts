/**
 * smtp-client - a small SMTP client for end-to-end tests that records every reply literally
 * (STYLE 19), binds any 127.x source address, and can send an exact byte sequence as DATA.
 */
import { connect, type Socket } from 'node:net';

export interface Reply {
  code: number;
  /** Every line of the reply, as sent, without CRLF. */
  lines: string[];
  /** The lines joined with '\n'. */
  text: string;
}

export class SmtpClient {
  readonly #socket: Socket;
  #buffer = '';
  #lines: string[] = [];
  #waiters: ((reply: Reply | Error) => void)[] = [];
  #replies: Reply[] = [];
  #closed: Error | null = null;

  private constructor(socket: Socket) {
    this.#socket = socket;
    socket.setEncoding('latin1');
    socket.on('data', (data: string) => this.#onData(data));
    socket.on('close', () => this.#fail(new Error('connection closed')));
    socket.on('error', (error) => this.#fail(error));
  }

  /** Connects and reads the greeting. */
  static async open(
    port: number,
    options: { host?: string; localAddress?: string } = {},
  ): Promise<{ client: SmtpClient; greeting: Reply }> {
    const socket = connect({ port, host: options.host ?? '127.0.0.1', localAddress: options.localAddress });
    await new Promise<void>((resolve, reject) => {
      socket.once('connect', resolve);
      socket.once('error', reject);
    });
    const client = new SmtpClient(socket);
    return { client, greeting: await client.read() };
  }

  #onData(data: string): void {
    this.#buffer += data;
    for (let end = this.#buffer.indexOf('\r\n'); end >= 0; end = this.#buffer.indexOf('\r\n')) {
      const line = this.#buffer.slice(0, end);
      this.#buffer = this.#buffer.slice(end + 2);
      this.#lines.push(line);
      if (line[3] !== '-') {
        const reply = { code: Number(line.slice(0, 3)), lines: this.#lines, text: this.#lines.join('\n') };
        this.#lines = [];
        const waiter = this.#waiters.shift();
        if (waiter) waiter(reply);
        else this.#replies.push(reply);
      }
    }
  }

  #fail(error: Error): void {
    this.#closed ??= error;
    for (const waiter of this.#waiters.splice(0)) waiter(error);
  }

  /** The next reply. */
  read(): Promise<Reply> {
    const queued = this.#replies.shift();
    if (queued) return Promise.resolve(queued);
    if (this.#closed) return Promise.reject(this.#closed);
    return new Promise((resolve, reject) => {
      this.#waiters.push((reply) => (reply instanceof Error ? reject(reply) : resolve(reply)));
    });
  }

  async command(line: string): Promise<Reply> {
    this.#socket.write(`${line}\r\n`);
    return this.read();
  }

  /** Sends the message after a 354, dot-stuffed, with the final dot; returns the end-of-data reply. */
  async data(message: Buffer | string): Promise<{ start: Reply; end?: Reply }> {
    const start = await this.command('DATA');
    if (start.code !== 354) return { start };
    const bytes = typeof message === 'string' ? Buffer.from(message) : message;
    this.#socket.write(dotStuff(bytes));
    this.#socket.write(
      bytes.length === 0 || bytes.subarray(-2).toString() === '\r\n' ? '.\r\n' : '\r\n.\r\n',
    );
    return { start, end: await this.read() };
  }

  async quit(): Promise<void> {
    if (!this.#closed) {
      this.#socket.write('QUIT\r\n');
      await this.read().catch(() => undefined);
    }
    this.#socket.destroy();
  }

  close(): void {
    this.#socket.destroy();
  }
}

/** RFC 5321 4.5.2: a line starting with '.' gets one more. */
function dotStuff(bytes: Buffer): Buffer {
  const parts: Buffer[] = [];
  let start = 0;
  if (bytes[0] === 0x2e) parts.push(Buffer.from('.'));
  for (let i = bytes.indexOf('\r\n.'); i >= 0; i = bytes.indexOf('\r\n.', i + 3)) {
    parts.push(bytes.subarray(start, i + 2), Buffer.from('.'));
    start = i + 2;
  }
  parts.push(bytes.subarray(start));
  return Buffer.concat(parts);
}

export interface Transaction {
  from: string;
  to: string[];
  message: Buffer | string;
  helo?: string;
  localAddress?: string;
  /** ESMTP parameters for MAIL FROM, e.g. 'SIZE=1234'. */
  mailParams?: string;
  /** ESMTP parameters for every RCPT TO, e.g. 'NOTIFY=SUCCESS'. */
  rcptParams?: string;
}

export interface TransactionReplies {
  greeting: Reply;
  ehlo?: Reply;
  mail?: Reply;
  rcpt: Reply[];
  data?: Reply;
  end?: Reply;
}

/** The queue id in Postfix's `250 2.0.0 Ok: queued as ID` end-of-data reply, if that is the reply. */
export const queuedAs = (replies: TransactionReplies): string | undefined =>
  /^250 2\.0\.0 Ok: queued as (\w+)$/.exec(replies.end?.text ?? '')?.[1];

/** One whole session: greeting, EHLO, MAIL, every RCPT, DATA when a recipient was accepted, QUIT. */
export async function sendMail(port: number, t: Transaction): Promise<TransactionReplies> {
  const { client, greeting } = await SmtpClient.open(port, { localAddress: t.localAddress ?? '127.0.0.3' });
  const replies: TransactionReplies = { greeting, rcpt: [] };
  try {
    if (greeting.code !== 220) return replies;
    replies.ehlo = await client.command(`EHLO ${t.helo ?? 'mail.sender.test'}`);
    replies.mail = await client.command(`MAIL FROM:<${t.from}>${t.mailParams ? ` ${t.mailParams}` : ''}`);
    if (replies.mail.code !== 250) return replies;
    for (const to of t.to)
      replies.rcpt.push(await client.command(`RCPT TO:<${to}>${t.rcptParams ? ` ${t.rcptParams}` : ''}`));
    if (!replies.rcpt.some((r) => r.code === 250)) return replies;
    const { start, end } = await client.data(t.message);
    replies.data = start;
    replies.end = end;
    return replies;
  } finally {
    await client.quit();
  }
}
