/**
 * mta-client - a test-only MTA side of the milter protocol, speaking as Postfix 3.7 does (MAIL-FACTS
 * C.2, C.8): it sends commands and reads raw reply packets. Framing is written out again here rather than
 * imported from src/milter/codec.ts, so a codec bug cannot hide itself.
 */
import net from 'node:net';

export interface Reply {
  command: string;
  data: Buffer;
}

/** Postfix 3.7.11's offer (MAIL-FACTS C.4). */
export const POSTFIX_OFFER = { version: 6, actions: 0x1ff, protocol: 0x1fffff };

export function packet(command: string, ...parts: (Buffer | string)[]): Buffer {
  const data = Buffer.concat(parts.map((p) => (typeof p === 'string' ? Buffer.from(p, 'utf8') : p)));
  const head = Buffer.alloc(5);
  head.writeUInt32BE(data.length + 1);
  head.write(command, 4, 'latin1');
  return Buffer.concat([head, data]);
}

export const u32 = (n: number): Buffer => {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n);
  return b;
};

/** A reply as one readable string: command byte, then data with NULs as \0 (e.g. `c`, `y451 ...\0`). */
export const show = (reply: Reply): string => reply.command + reply.data.toString('latin1');

export class MtaClient {
  readonly socket: net.Socket;
  readonly closed: Promise<void>;
  #buffer = Buffer.alloc(0);
  #replies: Reply[] = [];
  #waiters: (() => void)[] = [];
  #ended = false;

  private constructor(socket: net.Socket) {
    this.socket = socket;
    socket.on('data', (chunk: Buffer) => {
      this.#buffer = Buffer.concat([this.#buffer, chunk]);
      while (this.#buffer.length >= 4 && this.#buffer.length >= 4 + this.#buffer.readUInt32BE(0)) {
        const length = this.#buffer.readUInt32BE(0);
        const body = this.#buffer.subarray(4, 4 + length);
        this.#buffer = this.#buffer.subarray(4 + length);
        this.#replies.push({
          command: String.fromCharCode(body[0] ?? 0),
          data: Buffer.from(body.subarray(1)),
        });
      }
      this.#wake();
    });
    socket.on('error', () => {});
    this.closed = new Promise((resolve) =>
      socket.once('close', () => {
        this.#ended = true;
        this.#wake();
        resolve();
      }),
    );
  }

  static async connect(address: string): Promise<MtaClient> {
    const unix = address.startsWith('unix:') ? address.slice(5) : undefined;
    const inet = /^inet:\[?([^\]]*)\]?:(\d+)$/.exec(address);
    const socket = unix ? net.connect(unix) : net.connect(Number(inet?.[2]), inet?.[1]);
    await new Promise<void>((resolve, reject) => {
      socket.once('connect', resolve);
      socket.once('error', reject);
    });
    socket.setNoDelay(true);
    return new MtaClient(socket);
  }

  #wake(): void {
    for (const waiter of this.#waiters.splice(0)) waiter();
  }

  send(command: string, ...parts: (Buffer | string)[]): void {
    this.socket.write(packet(command, ...parts));
  }

  /** The next reply; fails after timeoutMs, or if the connection closes first. */
  async read(timeoutMs = 2000): Promise<Reply> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const reply = this.#replies.shift();
      if (reply) return reply;
      if (this.#ended) throw new Error('connection closed while waiting for a reply');
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`no reply within ${timeoutMs} ms`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.#waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }

  /** Replies received so far and not yet read, after waiting ms (to show that nothing more arrives). */
  async pending(ms: number): Promise<Reply[]> {
    await new Promise((resolve) => setTimeout(resolve, ms));
    return this.#replies.splice(0);
  }

  async negotiate(offer = POSTFIX_OFFER): Promise<Reply> {
    this.send('O', u32(offer.version), u32(offer.actions), u32(offer.protocol));
    return this.read();
  }

  macros(stage: string, pairs: Record<string, string>): void {
    this.send('D', stage, ...Object.entries(pairs).flatMap(([k, v]) => [`${k}\0`, `${v}\0`]));
  }

  connectInfo(hostname: string, address: string, port = 40179): void {
    const p = Buffer.alloc(2);
    p.writeUInt16BE(port);
    this.send('C', `${hostname}\0`, address.includes(':') ? '6' : '4', p, `${address}\0`);
  }

  helo(name: string): void {
    this.send('H', `${name}\0`);
  }
  mail(...args: string[]): void {
    this.send('M', ...args.map((a) => `${a}\0`));
  }
  rcpt(...args: string[]): void {
    this.send('R', ...args.map((a) => `${a}\0`));
  }
  data(): void {
    this.send('T');
  }
  header(name: string, value: string | Buffer): void {
    this.send('L', `${name}\0`, value, '\0');
  }
  eoh(): void {
    this.send('N');
  }
  body(chunk: string | Buffer): void {
    this.send('B', chunk);
  }
  eob(): void {
    this.send('E');
  }
  abort(): void {
    this.send('A');
  }
  quit(): void {
    this.send('Q');
  }
  close(): void {
    this.socket.destroy();
  }
}

/** The events Postfix sends for CONNECT, HELO, MAIL and RCPT. The milter negotiated no reply to any of
 * them (NR_CONN, NR_HELO, NR_MAIL, NR_RCPT): a stray reply would be read in place of the next one. */
export async function envelope(
  mta: MtaClient,
  from = '<s@allowed.test>',
  recipients = ['<good@svc.test>'],
  mailArgs: string[] = ['SIZE=1234'],
): Promise<void> {
  mta.macros('C', { j: 'mx.svc.test', '{daemon_name}': 'mx.svc.test', v: 'Postfix 3.7.11' });
  mta.connectInfo('mail.sender.test', '127.0.0.3');
  mta.macros('H', {});
  mta.helo('mail.sender.test');
  mta.macros('M', { '{mail_addr}': from.slice(1, -1), '{mail_mailer}': 'smtp' });
  mta.mail(from, ...mailArgs);
  for (const rcpt of recipients) {
    mta.macros('R', { '{rcpt_addr}': rcpt.slice(1, -1), '{rcpt_mailer}': 'lmtp' });
    mta.rcpt(rcpt);
  }
}
