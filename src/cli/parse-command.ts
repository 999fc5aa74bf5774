/**
 * parse-command - turns inboxctl's argv into one command value, or a UsageError saying what is wrong.
 *
 * Pure and I/O-free: it checks shapes only (an inbox id's format, a domain name's syntax, the 20-entry
 * bound on sender domains, contract sections 1-2). Whether the inbox exists or a domain has opted out is
 * the command's business, once the database is reachable.
 */
import { INBOX_ID } from '../core/ids.ts';
import { isDomainName, MAX_SENDER_DOMAINS, normalizeSenderDomains } from '../core/sender-domains.ts';

export type Command =
  | { kind: 'help' }
  | { kind: 'migrate' }
  | { kind: 'inbox-create'; senderDomains: string[] }
  | { kind: 'inbox-cancel'; inboxId: string }
  | { kind: 'optout-add'; domain: string }
  | { kind: 'optout-remove'; domain: string }
  | { kind: 'optout-list'; json: boolean };

/** Bad arguments: the message is one line, fit to print after "inboxctl: ". */
export class UsageError extends Error {}

export const USAGE = `usage: inboxctl <command> [arguments]

commands:
  migrate                                   apply pending database migrations
  inbox create [--sender-domain DOMAIN]...  provision an inbox (also while PROVISIONING=closed);
                                            prints the provisioned inbox, credentials included, as JSON
  inbox cancel INBOX_ID                     cancel an inbox for abuse: its mail is deleted at once and
                                            both credentials answer 410 inbox_cancelled
  optout add DOMAIN                         refuse mail from DOMAIN and its subdomains, for every inbox
  optout remove DOMAIN                      withdraw DOMAIN's opt-out
  optout list [--json]                      the opted-out domains, one per line (or a JSON array)

options:
  -h, --help                                show this help

Configuration comes from the same environment as the service (DATABASE_URL, SECRET_KEY, ...).
Exit status: 0 done, 1 failed, 64 bad arguments, 78 bad configuration.
`;

interface Parsed {
  positionals: string[];
  senderDomains: string[];
  /** Options given, by name, in order (repeats kept). */
  options: string[];
  help: boolean;
}

function tokenize(argv: string[]): Parsed {
  const parsed: Parsed = { positionals: [], senderDomains: [], options: [], help: false };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] as string;
    if (arg === '--') {
      parsed.positionals.push(...argv.slice(i + 1));
      break;
    }
    if (arg === '-h' || arg === '--help') {
      parsed.help = true;
    } else if (arg.startsWith('--')) {
      const eq = arg.indexOf('=');
      const name = eq === -1 ? arg.slice(2) : arg.slice(2, eq);
      const inline = eq === -1 ? undefined : arg.slice(eq + 1);
      if (name === 'sender-domain') {
        const next = argv[i + 1];
        const value = inline ?? (next !== undefined && !next.startsWith('-') ? next : undefined);
        if (value === undefined) throw new UsageError('option --sender-domain needs a domain name');
        if (inline === undefined) i++;
        parsed.senderDomains.push(value);
      } else if (name === 'json') {
        if (inline !== undefined) throw new UsageError('option --json takes no value');
      } else {
        throw new UsageError(`unknown option ${JSON.stringify(`--${name}`)}`);
      }
      parsed.options.push(name);
    } else if (arg.startsWith('-') && arg !== '-') {
      throw new UsageError(`unknown option ${JSON.stringify(arg)}`);
    } else {
      parsed.positionals.push(arg);
    }
  }
  return parsed;
}

/** Checks a parsed command line against what one command accepts. */
function expect(parsed: Parsed, name: string, operands: string[], options: string[]): string[] {
  const stray = parsed.options.find((option) => !options.includes(option));
  if (stray !== undefined) throw new UsageError(`option --${stray} does not apply to "${name}"`);
  const words = name.split(' ').length;
  const given = parsed.positionals.slice(words);
  if (given.length < operands.length) {
    throw new UsageError(`"${name}" needs ${operands.slice(given.length).join(' and ')}`);
  }
  if (given.length > operands.length) {
    throw new UsageError(`unexpected argument ${JSON.stringify(given[operands.length])} after "${name}"`);
  }
  return given;
}

function domainOperand(value: string): string {
  if (!isDomainName(value)) throw new UsageError(`${JSON.stringify(value)} is not a domain name`);
  // Stored as sender_domains entries are: lowercased, without a trailing dot (contract section 2).
  return normalizeSenderDomains([value])[0] as string;
}

export function parseCommand(argv: string[]): Command {
  const parsed = tokenize(argv);
  const [group, action] = parsed.positionals;
  if (parsed.help) return { kind: 'help' };
  if (group === undefined) throw new UsageError('missing command');
  switch (group) {
    case 'migrate':
      expect(parsed, 'migrate', [], []);
      return { kind: 'migrate' };
    case 'inbox':
      if (action === 'create') return inboxCreate(parsed);
      if (action === 'cancel') {
        const [inboxId] = expect(parsed, 'inbox cancel', ['INBOX_ID'], []) as [string];
        if (!INBOX_ID.test(inboxId)) {
          throw new UsageError(
            `${JSON.stringify(inboxId)} is not an inbox id (20 characters of 0-9 and a-z without i, l, o, u)`,
          );
        }
        return { kind: 'inbox-cancel', inboxId };
      }
      throw subcommand('inbox', action, ['create', 'cancel']);
    case 'optout':
      if (action === 'add' || action === 'remove') {
        const [domain] = expect(parsed, `optout ${action}`, ['DOMAIN'], []) as [string];
        return { kind: action === 'add' ? 'optout-add' : 'optout-remove', domain: domainOperand(domain) };
      }
      if (action === 'list') {
        expect(parsed, 'optout list', [], ['json']);
        return { kind: 'optout-list', json: parsed.options.includes('json') };
      }
      throw subcommand('optout', action, ['add', 'remove', 'list']);
    default:
      throw new UsageError(`unknown command ${JSON.stringify(group)}`);
  }
}

function inboxCreate(parsed: Parsed): Command {
  expect(parsed, 'inbox create', [], ['sender-domain']);
  const bad = parsed.senderDomains.find((domain) => !isDomainName(domain));
  if (bad !== undefined) throw new UsageError(`--sender-domain ${JSON.stringify(bad)} is not a domain name`);
  if (parsed.senderDomains.length > MAX_SENDER_DOMAINS) {
    throw new UsageError(
      `at most ${MAX_SENDER_DOMAINS} --sender-domain options (got ${parsed.senderDomains.length})`,
    );
  }
  return { kind: 'inbox-create', senderDomains: normalizeSenderDomains(parsed.senderDomains) };
}

function subcommand(group: string, action: string | undefined, known: string[]): UsageError {
  const choices = known.join(', ');
  return action === undefined
    ? new UsageError(`"${group}" needs a command: ${choices}`)
    : new UsageError(`unknown ${group} command ${JSON.stringify(action)} (expected ${choices})`);
}
