/**
 * milter-message - a message as the milter adapter hands it to MilterCheck, for tests and benchmarks
 * that call MilterCheck directly: the envelope of a transaction and the header fields as Postfix sends
 * them (value after the colon, LF line ends).
 */
import type { MilterEnvelope, MilterHeader } from '../../src/milter/handler.ts';

/** A transaction from a client with a verified name (CLIENTS.good), to one inbox address. */
export function milterEnvelope(overrides: Partial<MilterEnvelope> = {}): MilterEnvelope {
  return {
    queueId: 'Q1',
    clientAddress: '127.0.0.3',
    clientName: 'mail.sender.test',
    helo: 'mail.sender.test',
    envelopeFrom: 's@allowed.test',
    mailArgs: [],
    recipients: ['x@svc.test'],
    macros: new Map(),
    ...overrides,
  };
}

/** The header fields of `raw` as the milter gets them, and the body after the blank line. */
export function milterMessage(raw: Buffer): { headers: MilterHeader[]; body: Buffer } {
  const text = raw.toString('latin1');
  const end = text.indexOf('\r\n\r\n');
  const headers = text
    .slice(0, end)
    .split(/\r\n(?![ \t])/)
    .map((field) => {
      const colon = field.indexOf(':');
      return { name: field.slice(0, colon), value: field.slice(colon + 1).replace(/\r\n/g, '\n') };
    });
  return { headers, body: raw.subarray(end + 4) };
}
