/**
 * mail-from - MAIL FROM read as Postfix's LMTP client sends it, installed over smtp-server's
 * `SMTPConnection#_parseAddressCommand` for MAIL only (smtp-server 3.21; the version is checked).
 *
 * Why: smtp-server answers `501 Error: Bad sender address syntax` to reverse-paths that Postfix has
 * already accepted and queued: a quoted local part holding a space, an "@" or a ">" (`"john
 * doe"@example.com`), consecutive dots (`john..doe@example.com`, which Postfix passes on quoted), an
 * underscore in the domain. Its parser cuts the command at white space and then checks the address's
 * syntax. A 5xx after queueing bounces the message, and with `default_transport = discard:` the bounce
 * goes nowhere: the mail was lost without a word. The receiver answers 2xx or 4xx only (DESIGN
 * decision 1), and what a sender may be was decided before queueing, by Postfix and the milter.
 *
 * What it does instead: finds the reverse-path's closing ">" outside quoted strings (RFC 5321 4.1.2: a
 * Quoted-string may hold spaces, "@" and ">"; inside one, a backslash quotes the next character), hands
 * smtp-server's own parser the command with a placeholder in place of the address, so that the
 * parameters (SIZE, BODY, SMTPUTF8) still go through its checks, and returns the address as sent, a
 * source route dropped (RFC 5321 appendix C). RCPT keeps smtp-server's parser: the policy daemon lets
 * through only our own inbox addresses, which are plain.
 */
import type { SMTPConnection } from 'smtp-server/lib/smtp-connection.js';
import { SMTPConnection as Connection } from 'smtp-server/lib/smtp-connection.js';
import { methodPatch } from './smtp-server-patch.ts';

type Parse = SMTPConnection['_parseAddressCommand'];

const prototype = (Connection as unknown as { prototype: { _parseAddressCommand: Parse } }).prototype;
const original = prototype._parseAddressCommand;

const MAIL_FROM = /^\s*MAIL\s+FROM\s*:\s*/i;
/** Any address smtp-server's own checks pass, to parse the parameters after it. */
const PLACEHOLDER = 'sender@placeholder.invalid';

/** The text between the reverse-path's angle brackets and what follows it; undefined without one. */
export function splitReversePath(command: string): { path: string; rest: string } | undefined {
  const prefix = MAIL_FROM.exec(command);
  if (!prefix) return undefined;
  const open = prefix[0].length;
  if (command[open] !== '<') return undefined;
  let quoted = false;
  for (let i = open + 1; i < command.length; i++) {
    const c = command[i];
    if (quoted && c === '\\') i++;
    else if (c === '"') quoted = !quoted;
    else if (c === '>' && !quoted) return { path: command.slice(open + 1, i), rest: command.slice(i + 1) };
  }
  return undefined;
}

/** The mailbox of a reverse-path, an RFC 5321 source route ("@relay.example,@other.example:") dropped. */
export function mailboxOf(path: string): string {
  return path.startsWith('@') ? path.replace(/^@[^:]*:/, '') : path;
}

function parseAddressCommand(
  this: SMTPConnection,
  name: string,
  command: Buffer | string,
): ReturnType<Parse> {
  const split = name.trim().toUpperCase() === 'MAIL FROM' ? splitReversePath(command.toString()) : undefined;
  if (!split) return original.call(this, name, command);
  const mailbox = mailboxOf(split.path);
  const parsed = original.call(this, name, `MAIL FROM:<${mailbox ? PLACEHOLDER : ''}>${split.rest}`);
  return parsed && { ...parsed, address: mailbox };
}

export const mailFromParser = methodPatch(prototype, '_parseAddressCommand', parseAddressCommand, {
  module: 'mail-from.ts',
  without:
    "smtp-server's own MAIL FROM parser stays, and refuses with 501 some senders Postfix accepted (Postfix's lmtp service defers them: soft_bounce)",
});
