/**
 * render - turns the templates in postfix/ (main.cf, master.cf) into one Postfix instance's
 * configuration, from the service's Config.
 *
 * Pure apart from reading the two template files (resolved from this module's location, never from
 * the working directory). Writes nothing. Throws an Error naming the file and every placeholder left
 * unfilled, and rejects values that would corrupt a main.cf line (line breaks; whitespace or commas in
 * directory paths). Which placeholder comes from which variable: postfix/README.md "How the templates
 * are rendered".
 */
import { readFileSync } from 'node:fs';
import { dirname, isAbsolute } from 'node:path';
import { domainToUnicode, fileURLToPath } from 'node:url';
import { type Config, ConfigError, HOST_NAME, type Listen } from '../config/config.ts';

/** The templates' directory: `<repo>/postfix`. */
export const TEMPLATE_DIRECTORY = fileURLToPath(new URL('../../postfix/', import.meta.url));

/** Where one instance keeps its files; all absolute. */
export interface PostfixDirs {
  configDirectory: string;
  queueDirectory: string;
  dataDirectory: string;
  maillogFile: string;
}

export interface PostfixFiles {
  mainCf: string;
  masterCf: string;
}

/** The parts of Config the templates use (a whole Config fits). */
export type PostfixSettings = Pick<
  Config,
  | 'mailDomain'
  | 'authservId'
  | 'smtpHost'
  | 'smtpPort'
  | 'policyListen'
  | 'milterListen'
  | 'lmtpListen'
  | 'maxMessageBytes'
  | 'reservationTtlSeconds'
>;

/** Room above MAX_MESSAGE_BYTES for envelope records and added headers (MAIL-FACTS D.2). */
export const MESSAGE_SIZE_SLACK = 65536;

/** A {host,port} as Postfix writes a TCP endpoint: IPv6 literals in brackets. */
const hostPort = (host: string, port: number): string => `${host.includes(':') ? `[${host}]` : host}:${port}`;

/**
 * A policy or milter endpoint in Postfix syntax: `inet:host:port` or `unix:/absolute/path`
 * (check_policy_service and smtpd_milters both take these two forms; postconf(5), MILTER_README).
 */
export function postfixEndpoint(listen: Listen): string {
  return 'path' in listen ? `unix:${listen.path}` : `inet:${hostPort(listen.host, listen.port)}`;
}

/**
 * lmtp_connection_cache_destinations for the LMTP endpoint. A TCP destination is named by its host
 * without the port (MAIL-FACTS D.1). A unix socket is matched by its path, but a list entry starting
 * with "/" is read as a file of patterns, and an inline table folds its keys to lower case while the
 * path is looked up as is; `static:all` (every LMTP destination, and the receiver is the only one)
 * works for any path.
 */
export function lmtpCacheDestinations(listen: Listen): string {
  if ('path' in listen) return 'static:all';
  return listen.host.includes(':') ? `[${listen.host}]` : listen.host;
}

const WILDCARD_HOSTS = new Set(['', '*', '0.0.0.0', '::']);

function smtpListen(host: string, port: number): { listen: string; interfaces: string } {
  if (WILDCARD_HOSTS.has(host)) return { listen: String(port), interfaces: 'all' };
  return { listen: hostPort(host, port), interfaces: host.includes(':') ? `[${host}]` : host };
}

/** IPv4 only, unless a listener or an endpoint we connect to is IPv6 (or SMTP listens on every address). */
function inetProtocols(settings: PostfixSettings): string {
  const endpoints = [settings.policyListen, settings.milterListen, settings.lmtpListen];
  const hosts = [settings.smtpHost, ...endpoints.map((l) => ('host' in l ? l.host : ''))];
  return settings.smtpHost === '*' || hosts.some((h) => h.includes(':')) ? 'all' : 'ipv4';
}

function directory(name: string, path: string): string {
  if (!isAbsolute(path)) throw new Error(`Postfix ${name} must be an absolute path (got "${path}")`);
  if (/[\s,]/.test(path))
    throw new Error(`Postfix ${name} must not contain whitespace or commas ("${path}")`);
  return path;
}

/**
 * Port 0 (any free port) is no port Postfix can listen on or connect to: `all` passes the ports its
 * daemons bound (src/main.ts); anywhere else it is a configuration error.
 */
function checkPorts(settings: PostfixSettings): void {
  if (settings.smtpPort === 0) {
    throw new ConfigError('SMTP_PORT', 'must be a port Postfix can listen on (1-65535), not 0');
  }
  for (const [variable, listen] of [
    ['POLICY_PORT', settings.policyListen],
    ['MILTER_PORT', settings.milterListen],
    ['LMTP_PORT', settings.lmtpListen],
  ] as const) {
    if ('port' in listen && listen.port === 0) {
      throw new ConfigError(variable, "must name a port (1-65535) for Postfix's configuration, not 0");
    }
  }
}

/**
 * virtual_mailbox_domains: MAIL_DOMAIN, and for an IDN (`xn--bcher-kva.example`) its Unicode form too,
 * which an SMTPUTF8 client may write and Postfix does not convert (SMTPUTF8_README, "No automatic
 * conversions"): listed once, such a recipient got `554 Relay access denied`, a bounce.
 */
export function mailDomains(mailDomain: string): string {
  const unicode = domainToUnicode(mailDomain);
  return unicode && unicode !== mailDomain ? `${mailDomain}, ${unicode}` : mailDomain;
}

/** Every placeholder value, by name (without braces). */
export function placeholderValues(settings: PostfixSettings, dirs: PostfixDirs): Record<string, string> {
  checkPorts(settings);
  if (!HOST_NAME.test(settings.authservId)) {
    throw new Error(
      `AUTHSERV_ID must be a host name to serve as Postfix's myhostname (got "${settings.authservId}")`,
    );
  }
  const smtp = smtpListen(settings.smtpHost, settings.smtpPort);
  return {
    MAIL_DOMAINS: mailDomains(settings.mailDomain),
    MYHOSTNAME: settings.authservId,
    QUEUE_DIRECTORY: directory('queue directory', dirs.queueDirectory),
    DATA_DIRECTORY: directory('data directory', dirs.dataDirectory),
    MAILLOG_FILE: directory('maillog file', dirs.maillogFile),
    MAILLOG_FILE_PREFIXES: dirname(dirs.maillogFile),
    SMTP_LISTEN: smtp.listen,
    INET_INTERFACES: smtp.interfaces,
    INET_PROTOCOLS: inetProtocols(settings),
    POLICY_SERVICE: postfixEndpoint(settings.policyListen),
    MILTER: postfixEndpoint(settings.milterListen),
    LMTP_DESTINATION: postfixEndpoint(settings.lmtpListen),
    LMTP_CACHE_DESTINATIONS: lmtpCacheDestinations(settings.lmtpListen),
    MESSAGE_SIZE_LIMIT: String(settings.maxMessageBytes + MESSAGE_SIZE_SLACK),
  };
}

/** The text of one template file in postfix/. */
export function readTemplate(name: 'main.cf' | 'master.cf'): string {
  return readFileSync(`${TEMPLATE_DIRECTORY}${name}`, 'utf8');
}

/** Replaces every `{{NAME}}`; throws naming the placeholders that have no value. */
export function fillTemplate(file: string, template: string, values: Record<string, string>): string {
  const missing = new Set<string>();
  const filled = template.replace(/\{\{([A-Z0-9_]+)\}\}/g, (whole, name: string) => {
    const value = values[name];
    if (value === undefined) {
      missing.add(name);
      return whole;
    }
    if (/[\r\n]/.test(value)) throw new Error(`${file}: the value of {{${name}}} contains a line break`);
    return value;
  });
  if (missing.size > 0) {
    throw new Error(
      `${file}: placeholder(s) left unfilled: ${[...missing].map((n) => `{{${n}}}`).join(', ')}`,
    );
  }
  return filled;
}

/**
 * Sets main.cf parameters: each replaces the existing `name = ...` line (with its continuation lines)
 * or is appended. An empty value is kept as `name =` (Postfix's "none").
 */
export function applyOverrides(mainCf: string, overrides: Record<string, string>): string {
  const lines = mainCf.replace(/\n$/, '').split('\n');
  for (const [name, value] of Object.entries(overrides)) {
    if (!/^[a-z0-9_]+$/.test(name)) throw new Error(`main.cf override: "${name}" is not a parameter name`);
    if (/[\r\n]/.test(value)) throw new Error(`main.cf override ${name}: the value contains a line break`);
    const line = value === '' ? `${name} =` : `${name} = ${value}`;
    const at = lines.findIndex((l) => new RegExp(`^${name}\\s*=`).test(l));
    if (at === -1) {
      lines.push(line);
      continue;
    }
    let end = at + 1;
    while (end < lines.length && /^[ \t]+\S/.test(lines[end] ?? '')) end++;
    lines.splice(at, end - at, line);
  }
  return `${lines.join('\n')}\n`;
}

const TIME_UNITS: Record<string, number> = { s: 1, m: 60, h: 3600, d: 86400, w: 604800 };

/**
 * The seconds of a time parameter in main.cf (postconf(5): a number with an optional unit s, m, h, d
 * or w; `unit` when none; Postfix's `fallback` when the line is absent).
 */
function timeSetting(mainCf: string, name: string, fallback: string, unit: string): number {
  const value = new RegExp(`^${name}\\s*=\\s*(\\S*)\\s*$`, 'm').exec(mainCf)?.[1] ?? fallback;
  const match = /^(\d+)([smhdw]?)$/.exec(value);
  if (!match) throw new Error(`postfix/main.cf: ${name} "${value}" is not a time value`);
  return Number(match[1]) * (TIME_UNITS[match[2] || unit] ?? 1);
}

/** maximal_queue_lifetime in seconds (days when no unit; Postfix's default 5d). */
export function queueLifetimeSeconds(mainCf: string): number {
  return timeSetting(mainCf, 'maximal_queue_lifetime', '5d', 'd');
}

/**
 * How long past maximal_queue_lifetime Postfix may still deliver a message: the queue manager expires
 * a message only after a delivery attempt fails (postconf(5) maximal_queue_lifetime), and the attempt
 * before that may come maximal_backoff_time (4000 s) plus a queue_run_delay (300 s) after the one
 * before, just under the lifetime; the attempt itself then takes up to the LMTP client's timeouts
 * (LMTP_ATTEMPT_SECONDS). Postfix's queue clock starts when the queue file is made, before the milter
 * reserves, so that gap is on the safe side. (Until 2026-11-25 a flat hour, which a message deferred
 * just before its lifetime could outlive: found by a mail-admin review.)
 */
export function lastDeliverySlackSeconds(mainCf: string): number {
  return (
    timeSetting(mainCf, 'maximal_backoff_time', '4000s', 's') +
    timeSetting(mainCf, 'queue_run_delay', '300s', 's') +
    LMTP_ATTEMPT_SECONDS
  );
}

/** One LMTP delivery attempt at its slowest: lmtp_data_done_timeout (600 s) and the rest, rounded up. */
export const LMTP_ATTEMPT_SECONDS = 1800;

/**
 * A message Postfix delivers after the release job freed its reservation is dropped (answered 250,
 * README "Configuration"), so a queue may not hold mail longer than a reservation lives.
 */
function checkReservationOutlivesQueue(settings: PostfixSettings, mainCf: string): void {
  const lifetime = queueLifetimeSeconds(mainCf);
  const slack = lastDeliverySlackSeconds(mainCf);
  if (settings.reservationTtlSeconds < lifetime + slack) {
    throw new ConfigError(
      'RESERVATION_TTL_SECONDS',
      `must be at least Postfix's maximal_queue_lifetime (${lifetime} s) plus ${slack} s ` +
        `(maximal_backoff_time, queue_run_delay and ${LMTP_ATTEMPT_SECONDS} s for the last attempt): ` +
        `mail Postfix delivers after its quota reservation was released is dropped (got ${settings.reservationTtlSeconds})`,
    );
  }
}

/** main.cf and master.cf for one instance of the receiving MX. */
export function renderPostfix(
  settings: PostfixSettings,
  dirs: PostfixDirs,
  overrides: Record<string, string> = {},
): PostfixFiles {
  const values = placeholderValues(settings, dirs);
  const mainCf = applyOverrides(fillTemplate('postfix/main.cf', readTemplate('main.cf'), values), overrides);
  checkReservationOutlivesQueue(settings, mainCf);
  const masterCf = fillTemplate('postfix/master.cf', readTemplate('master.cf'), values);
  return { mainCf, masterCf };
}
