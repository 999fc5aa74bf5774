/**
 * lmtp-client - a raw LMTP client for the receiver tests: sends commands one at a time as Postfix's
 * lmtp(8) would (LHLO, XFORWARD, MAIL, RCPT, DATA), keeps a transcript, and reads one reply per
 * accepted recipient after the final dot (RFC 2033 section 4.2). The body is dot-stuffed and written
 * with backpressure, so a large message streams.
 */
import net from 'node:net';

export class LmtpClient {
  readonly #socket: net.Socket;
  #buffer = '';
  readonly #lines: string[] = [];
  #wake: (() => void) | null = null;
  #closed = false;
  /** `C: ...` and `S: ...` lines, in order (DATA content is not recorded). */
  readonly transcript: string[] = [];

  private constructor(socket: net.Socket) {
    this.#socket = socket;
    socket.setEncoding('latin1');
    socket.on('data', (text: string) => {
      this.#buffer += text;
      for (let end = this.#buffer.indexOf('\r\n'); end !== -1; end = this.#buffer.indexOf('\r\n')) {
        this.#lines.push(this.#buffer.slice(0, end));
        this.#buffer = this.#buffer.slice(end + 2);
      }
      this.#wake?.();
    });
    socket.on('close', () => {
      this.#closed = true;
      this.#wake?.();
    });
    socket.on('error', () => {});
  }

  static async connect(target: { port: number; host?: string } | { path: string }): Promise<LmtpClient> {
    const socket = await new Promise<net.Socket>((resolve, reject) => {
      const s =
        'path' in target ? net.connect(target.path) : net.connect(target.port, target.host ?? '127.0.0.1');
      s.once('connect', () => resolve(s));
      s.once('error', reject);
    });
    const client = new LmtpClient(socket);
    await client.reply();
    return client;
  }

  /** The next reply (all its lines); rejects if the server closes first. */
  async reply(): Promise<string[]> {
    const lines: string[] = [];
    for (;;) {
      const line = this.#lines.shift();
      if (line === undefined) {
        if (this.#closed) throw new Error(`connection closed; transcript:\n${this.transcript.join('\n')}`);
        await new Promise<void>((resolve) => (this.#wake = resolve));
        this.#wake = null;
        continue;
      }
      this.transcript.push(`S: ${line}`);
      lines.push(line);
      if (/^\d{3}(?: |$)/.test(line)) return lines;
    }
  }

  /** Sends one command line and returns the last line of its reply. */
  async command(line: string): Promise<string> {
    this.transcript.push(`C: ${line}`);
    this.#socket.write(`${line}\r\n`);
    const lines = await this.reply();
    return lines[lines.length - 1] as string;
  }

  /** Sends DATA, the dot-stuffed body pieces and the final dot; returns `replies` reply lines. */
  async data(body: Iterable<Buffer> | AsyncIterable<Buffer>, replies: number): Promise<string[]> {
    const go = await this.command('DATA');
    if (!go.startsWith('354')) throw new Error(`DATA refused: ${go}`);
    let tail = '\r\n';
    for await (const piece of body) {
      if (piece.length === 0) continue;
      await this.write(dotStuff(piece, tail.endsWith('\r\n')));
      tail = (tail + piece.subarray(-2).toString('latin1')).slice(-2);
    }
    // the end of data is CRLF . CRLF: a body not ending in CRLF gets one (RFC 5321 section 4.1.1.4)
    await this.write(Buffer.from(tail === '\r\n' ? '.\r\n' : '\r\n.\r\n'));
    this.transcript.push('C: <message>', 'C: .');
    const lines: string[] = [];
    for (let i = 0; i < replies; i++) lines.push(...(await this.reply()));
    return lines;
  }

  /** Writes bytes as they are (for sending half a message, or a malformed one). */
  async write(bytes: Buffer | string): Promise<void> {
    if (!this.#socket.write(bytes)) await new Promise((resolve) => this.#socket.once('drain', resolve));
  }

  async quit(): Promise<void> {
    if (!this.#closed) await this.command('QUIT').catch(() => {});
    this.#socket.destroy();
  }

  destroy(): void {
    this.#socket.destroy();
  }
}

/** Doubles a dot at the start of every line, a line being after CRLF (RFC 5321 section 4.5.2). */
function dotStuff(piece: Buffer, atLineStart: boolean): Buffer {
  const parts: Buffer[] = [];
  let from = 0;
  if (atLineStart && piece[0] === 0x2e) parts.push(Buffer.from('.'));
  for (let nl = piece.indexOf(0x0a); nl !== -1 && nl + 1 < piece.length; nl = piece.indexOf(0x0a, nl + 1)) {
    if (piece[nl + 1] === 0x2e && nl > 0 && piece[nl - 1] === 0x0d) {
      parts.push(piece.subarray(from, nl + 1), Buffer.from('.'));
      from = nl + 1;
    }
  }
  parts.push(piece.subarray(from));
  return parts.length === 1 ? piece : Buffer.concat(parts);
}

export interface RawDelivery {
  ident?: string;
  from: string;
  to: string[];
  body: Buffer | string;
}

/** One transaction on a new connection, as Postfix sends it; returns the per-recipient replies. */
export async function deliverRaw(
  target: { port: number } | { path: string },
  delivery: RawDelivery,
): Promise<{ replies: string[]; client: LmtpClient }> {
  const client = await LmtpClient.connect(target);
  await client.command('LHLO postfix.test');
  if (delivery.ident)
    await client.command(`XFORWARD PROTO=ESMTP HELO=mail.sender.test IDENT=${delivery.ident}`);
  await client.command(`MAIL FROM:<${delivery.from}>`);
  let accepted = 0;
  for (const rcpt of delivery.to)
    if ((await client.command(`RCPT TO:<${rcpt}>`)).startsWith('250')) accepted++;
  const body = typeof delivery.body === 'string' ? Buffer.from(delivery.body) : delivery.body;
  const replies = await client.data([body], accepted);
  await client.quit();
  return { replies, client };
}
