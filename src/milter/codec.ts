/**
 * codec - the Sendmail milter wire format (protocol version 6), pure and bounded (STYLE 7): bytes in,
 * commands out; replies in, bytes out. No I/O.
 *
 * Framing [Postfix src/milter/milter8.c, milter8_read_resp/vmilter8_write_cmd; MAIL-FACTS C.1]: a
 * uint32 big-endian length that counts the command byte plus its data, the command byte, the data.
 * Strings are NUL-terminated, an argv is a run of them, and all strings are decoded as UTF-8 (invalid
 * bytes become U+FFFD). Command layouts are MAIL-FACTS C.2, reply layouts C.3.
 *
 * Contract: FrameDecoder.push() returns the complete packets of the bytes so far or throws
 * MilterProtocolError; decodeCommand() throws MilterProtocolError on a packet it cannot parse. After
 * either throw the stream cannot be resynchronized and the caller must close the connection (Postfix
 * then applies milter_default_action).
 */

/** Largest packet we accept. Postfix sends body chunks of at most 65535 bytes (MILTER_CHUNK_SIZE) and
 * header fields of at most 60,000 bytes (cleanup cuts them there when a milter is configured, whatever
 * header_size_limit says; session.ts MAX_FIELD_BYTES); its own limit for our replies is INT_MAX/2. */
export const MAX_PACKET_BYTES = 1024 * 1024 + 1024;

/**
 * The stages a macro packet may name: the command bytes macros precede (MAIL-FACTS C.8), and at most
 * MAX_MACROS macros in one. Postfix's default lists hold at most 9 per stage; without these bounds a
 * peer could make the milter keep millions of tiny strings (a 1 MiB packet of them cost 16 MB of heap).
 */
export const MACRO_STAGES = ['C', 'H', 'U', 'M', 'R', 'T', 'L', 'N', 'B', 'E'];
export const MAX_MACROS = 256;

/** MTA→milter command bytes [milter8.c SMFIC_*]. */
export const SMFIC = {
  ABORT: 'A',
  BODY: 'B',
  CONNECT: 'C',
  MACRO: 'D',
  BODYEOB: 'E',
  HELO: 'H',
  QUIT_NC: 'K',
  HEADER: 'L',
  MAIL: 'M',
  EOH: 'N',
  OPTNEG: 'O',
  QUIT: 'Q',
  RCPT: 'R',
  DATA: 'T',
  UNKNOWN: 'U',
} as const;

/** Milter→MTA reply bytes we send [milter8.c SMFIR_*]. */
export const SMFIR = {
  CONTINUE: 'c',
  TEMPFAIL: 't',
  REPLYCODE: 'y',
  PROGRESS: 'p',
  INSHEADER: 'i',
  CHGHEADER: 'm',
  OPTNEG: 'O',
} as const;

export class MilterProtocolError extends Error {
  override name = 'MilterProtocolError';
}

export interface Packet {
  command: string;
  data: Buffer;
}

/**
 * Splits a byte stream into packets; holds at most one partial packet (≤ MAX_PACKET_BYTES). A packet
 * inside one read is returned as a view of it; a packet split across reads is copied into one buffer
 * of its declared length as its pieces come, so a packet sent a byte at a time costs linear time and
 * its own size in memory, not a list of a million one-byte reads.
 */
export class FrameDecoder {
  readonly #length = Buffer.alloc(4);
  #lengthFilled = 0;
  #partial: Buffer | undefined;
  #filled = 0;

  push(chunk: Buffer): Packet[] {
    const packets: Packet[] = [];
    let offset = 0;
    while (offset < chunk.length) {
      if (this.#partial === undefined) {
        let length: number;
        if (this.#lengthFilled === 0 && chunk.length - offset >= 4) {
          length = chunk.readUInt32BE(offset);
          offset += 4;
        } else {
          const used = Math.min(4 - this.#lengthFilled, chunk.length - offset);
          chunk.copy(this.#length, this.#lengthFilled, offset, offset + used);
          this.#lengthFilled += used;
          offset += used;
          if (this.#lengthFilled < 4) break;
          this.#lengthFilled = 0;
          length = this.#length.readUInt32BE(0);
        }
        if (length < 1 || length > MAX_PACKET_BYTES) {
          throw new MilterProtocolError(`packet length ${length} outside 1..${MAX_PACKET_BYTES}`);
        }
        if (chunk.length - offset >= length) {
          packets.push(packetOf(chunk.subarray(offset, offset + length)));
          offset += length;
          continue;
        }
        this.#partial = Buffer.allocUnsafe(length);
        this.#filled = 0;
      }
      const used = Math.min(this.#partial.length - this.#filled, chunk.length - offset);
      chunk.copy(this.#partial, this.#filled, offset, offset + used);
      this.#filled += used;
      offset += used;
      if (this.#filled === this.#partial.length) {
        packets.push(packetOf(this.#partial));
        this.#partial = undefined;
      }
    }
    return packets;
  }
}

function packetOf(bytes: Buffer): Packet {
  return { command: String.fromCharCode(bytes[0] ?? 0), data: bytes.subarray(1) };
}

export type MilterCommand =
  | { kind: 'optneg'; version: number; actions: number; protocol: number }
  /** stage: the command byte the macros precede ('C', 'H', 'M', 'R', 'T', 'L', 'N', 'B', 'E'). */
  | { kind: 'macro'; stage: string; macros: [string, string][] }
  /** family '4', '6', 'L' (unix) or 'U' (unknown: no port, no address). */
  | { kind: 'connect'; hostname: string; family: string; port: number | null; address: string }
  | { kind: 'helo'; name: string }
  | { kind: 'mail'; args: string[] }
  | { kind: 'rcpt'; args: string[] }
  | { kind: 'data' }
  | { kind: 'header'; name: string; value: string }
  | { kind: 'eoh' }
  | { kind: 'body'; chunk: Buffer }
  | { kind: 'eob'; chunk: Buffer }
  | { kind: 'abort' }
  | { kind: 'quit' }
  | { kind: 'quitNewConnection' }
  /** SMFIC_UNKNOWN: an SMTP command smtpd did not recognise. */
  | { kind: 'unknown'; command: string }
  /** A command byte this codec does not know. */
  | { kind: 'unrecognized'; code: string };

class Reader {
  readonly #data: Buffer;
  #offset = 0;
  constructor(data: Buffer) {
    this.#data = data;
  }
  get remaining(): number {
    return this.#data.length - this.#offset;
  }
  u32(what: string): number {
    if (this.remaining < 4) throw new MilterProtocolError(`${what}: packet too short`);
    const value = this.#data.readUInt32BE(this.#offset);
    this.#offset += 4;
    return value;
  }
  u16(what: string): number {
    if (this.remaining < 2) throw new MilterProtocolError(`${what}: packet too short`);
    const value = this.#data.readUInt16BE(this.#offset);
    this.#offset += 2;
    return value;
  }
  byte(what: string): string {
    if (this.remaining < 1) throw new MilterProtocolError(`${what}: packet too short`);
    return String.fromCharCode(this.#data[this.#offset++] as number);
  }
  string(what: string, encoding: 'utf8' | 'latin1' = 'utf8'): string {
    const end = this.#data.indexOf(0, this.#offset);
    if (end < 0) throw new MilterProtocolError(`${what}: string not NUL-terminated`);
    const value = this.#data.toString(encoding, this.#offset, end);
    this.#offset = end + 1;
    return value;
  }
  argv(what: string): string[] {
    const args: string[] = [];
    while (this.remaining > 0) args.push(this.string(what));
    if (args.length === 0) throw new MilterProtocolError(`${what}: no arguments`);
    return args;
  }
}

/** Parses one packet. Trailing bytes after the documented fields are ignored. */
export function decodeCommand(packet: Packet): MilterCommand {
  const r = new Reader(packet.data);
  switch (packet.command) {
    case SMFIC.OPTNEG:
      return {
        kind: 'optneg',
        version: r.u32('OPTNEG'),
        actions: r.u32('OPTNEG'),
        protocol: r.u32('OPTNEG'),
      };
    case SMFIC.MACRO: {
      const stage = r.byte('MACRO');
      if (!MACRO_STAGES.includes(stage)) throw new MilterProtocolError(`MACRO for unknown stage ${stage}`);
      const macros: [string, string][] = [];
      while (r.remaining > 0) {
        if (macros.length === MAX_MACROS)
          throw new MilterProtocolError(`MACRO with over ${MAX_MACROS} macros`);
        macros.push([r.string('MACRO name'), r.string('MACRO value')]);
      }
      return { kind: 'macro', stage, macros };
    }
    case SMFIC.CONNECT: {
      const hostname = r.string('CONNECT hostname');
      const family = r.byte('CONNECT family');
      if (family === 'U') return { kind: 'connect', hostname, family, port: null, address: '' };
      const port = r.u16('CONNECT port');
      return { kind: 'connect', hostname, family, port, address: r.string('CONNECT address') };
    }
    case SMFIC.HELO:
      return { kind: 'helo', name: r.string('HELO') };
    case SMFIC.MAIL:
      return { kind: 'mail', args: r.argv('MAIL') };
    case SMFIC.RCPT:
      return { kind: 'rcpt', args: r.argv('RCPT') };
    case SMFIC.DATA:
      return { kind: 'data' };
    case SMFIC.HEADER:
      // One character per byte: a header is rebuilt byte for byte whatever its charset (DKIM signs bytes).
      return {
        kind: 'header',
        name: r.string('HEADER name', 'latin1'),
        value: r.string('HEADER value', 'latin1'),
      };
    case SMFIC.EOH:
      return { kind: 'eoh' };
    case SMFIC.BODY:
      return { kind: 'body', chunk: packet.data };
    case SMFIC.BODYEOB:
      return { kind: 'eob', chunk: packet.data };
    case SMFIC.ABORT:
      return { kind: 'abort' };
    case SMFIC.QUIT:
      return { kind: 'quit' };
    case SMFIC.QUIT_NC:
      return { kind: 'quitNewConnection' };
    case SMFIC.UNKNOWN:
      return { kind: 'unknown', command: r.string('UNKNOWN') };
    default:
      return { kind: 'unrecognized', code: packet.command };
  }
}

function cstring(value: string, what: string): Buffer {
  if (value.includes('\0')) throw new Error(`${what} contains a NUL byte`);
  return Buffer.from(`${value}\0`, 'utf8');
}

function u32(value: number, what: string): Buffer {
  if (!Number.isInteger(value) || value < 0 || value > 0xffffffff) {
    throw new Error(`${what} ${value} is not a uint32`);
  }
  const out = Buffer.alloc(4);
  out.writeUInt32BE(value);
  return out;
}

export function encodePacket(command: string, ...parts: Buffer[]): Buffer {
  const length = 1 + parts.reduce((sum, part) => sum + part.length, 0);
  return Buffer.concat([u32(length, 'length'), Buffer.from(command, 'latin1'), ...parts]);
}

export const encodeContinue = (): Buffer => encodePacket(SMFIR.CONTINUE);
export const encodeTempfail = (): Buffer => encodePacket(SMFIR.TEMPFAIL);
/** Keeps Postfix waiting: it resets its milter_content_timeout (milter8.c SMFIR_PROGRESS). */
export const encodeProgress = (): Buffer => encodePacket(SMFIR.PROGRESS);

/** `y`: the SMTP reply as the sender should see it. Postfix reads it sendmail-style, turning `%%`
 * into `%` and dropping a lone `%` (milter8.c SMFIR_REPLYCODE), so every `%` is doubled here. */
export function encodeReplyCode(reply: string): Buffer {
  return encodePacket(SMFIR.REPLYCODE, cstring(reply.replaceAll('%', '%%'), 'reply'));
}

/** `i`: insert at 0-based index among all headers, Postfix's own Received: included. */
export function encodeInsertHeader(index: number, name: string, value: string): Buffer {
  return encodePacket(SMFIR.INSHEADER, u32(index, 'index'), cstring(name, 'name'), cstring(value, 'value'));
}

/** `m`: change the index-th (1-based) header of that name as received; an empty value deletes it. */
export function encodeChangeHeader(index: number, name: string, value: string): Buffer {
  return encodePacket(SMFIR.CHGHEADER, u32(index, 'index'), cstring(name, 'name'), cstring(value, 'value'));
}

export function encodeNegotiation(reply: { version: number; actions: number; protocol: number }): Buffer {
  return encodePacket(
    SMFIR.OPTNEG,
    u32(reply.version, 'version'),
    u32(reply.actions, 'actions'),
    u32(reply.protocol, 'protocol'),
  );
}
