/**
 * xforward - XFORWARD read without the attributes the receiver never uses, NAME and HELO, installed over
 * smtp-server's `SMTPConnection#handler_XFORWARD` (smtp-server 3.21; the version is checked).
 *
 * Why: smtp-server answers 501 to the whole command when one value fails its checks, and NAME and HELO
 * are the SMTP client's: HELO is whatever the client said. Postfix passes a UTF-8 HELO on xtext-encoded,
 * and smtp-server, decoding it byte by byte, takes UTF-8 continuation bytes (0x80-0x9F) for control
 * characters. Postfix sends HELO in the same command as IDENT, the queue id that makes a redelivery
 * idempotent (DESIGN decision 5), so a client that said `EHLO почта.рф` cost its message the queue id:
 * stored under a made-up one, and the milter's reservation under the real one kept the inbox's quota
 * until the reservation clean-up released it days later.
 *
 * What it does instead: hands smtp-server the command with its NAME and HELO attributes left out. A
 * command with nothing else goes to smtp-server unchanged (Postfix never sends one).
 */
import type { SMTPConnection } from 'smtp-server/lib/smtp-connection.js';
import { SMTPConnection as Connection } from 'smtp-server/lib/smtp-connection.js';
import { methodPatch } from './smtp-server-patch.ts';

type Handler = (this: SMTPConnection, command: Buffer, callback: () => void) => void;

const prototype = (Connection as unknown as { prototype: { handler_XFORWARD: Handler } }).prototype;
const original = prototype.handler_XFORWARD;

/** The attributes of an XFORWARD command that smtp-server is given; undefined to give it the command as is. */
export function keptAttributes(command: string): string | undefined {
  const [verb, ...attributes] = command.trim().split(/\s+/);
  const kept = attributes.filter((attribute) => !/^(NAME|HELO)=/i.test(attribute));
  if (kept.length === attributes.length || kept.length === 0) return undefined;
  return [verb, ...kept].join(' ');
}

function handleXForward(this: SMTPConnection, command: Buffer, callback: () => void): void {
  const kept = keptAttributes(command.toString('latin1'));
  original.call(this, kept === undefined ? command : Buffer.from(kept, 'latin1'), callback);
}

export const xforwardReader = methodPatch(prototype, 'handler_XFORWARD', handleXForward, {
  module: 'xforward.ts',
  without:
    "a client's UTF-8 HELO makes smtp-server refuse Postfix's XFORWARD, and that message loses its queue id (not idempotent)",
});
