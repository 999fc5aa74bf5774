/**
 * config - the service's environment, described once, checked once.
 *
 * Every variable the README's configuration table lists is read here and nowhere else. A bad value
 * stops the process with a message naming the variable (DESIGN "Where configuration lives").
 */

import { createRequire } from 'node:module';
import { isIP, isIPv4, isIPv6 } from 'node:net';
import { domainToASCII } from 'node:url';
import Type from 'typebox';
import { Compile } from 'typebox/compile';
import { LOG_LEVELS, type LogLevel } from '../log.ts';

export type Environment = 'dev' | 'prod';

export interface Config {
  environment: Environment;
  provisioning: 'open' | 'closed';
  databaseUrl: string;
  apiHost: string;
  apiPort: number;
  publicBaseUrl: string;
  mailDomain: string;
  abuseContact: string;
  /** undefined in dev until ensureSecretKey has made or read one. */
  secretKey: string | undefined;
  runDir: string;
  unitSeconds: number;
  quotaBytes: number;
  downloadGraceSeconds: number;
  unclaimedSeconds: number;
  goneSeconds: number;
  purgeAfterSeconds: number;
  rejectionRetentionSeconds: number;
  maxRejections: number;
  idempotencyTtlSeconds: number;
  pollRateBurst: number;
  pollRatePerSecond: number;
  downloadRateBurst: number;
  downloadRatePerSecond: number;
  /** Where our private Postfix instance listens for SMTP (`make run`). */
  smtpHost: string;
  smtpPort: number;
  /** Each is `host:port` or an absolute unix socket path. */
  policyListen: Listen;
  milterListen: Listen;
  lmtpListen: Listen;
  /** The authserv-id of our Authentication-Results field (RFC 8601); default the MX host name. */
  authservId: string;
  /** Resolvers for the PTR check and mailauth; empty: the system's. */
  dnsServers: string[];
  requirePtr: boolean;
  /** The largest message accepted, counted as the sender sent it (contract section 8). */
  maxMessageBytes: number;
  /** How often the jobs sweep; divides a minute, an hour or a day, so a cron expression can say it. */
  sweepIntervalSeconds: number;
  /** A reservation still in flight this long after the milter made it is released (DESIGN decision 4). */
  reservationTtlSeconds: number;
  /** Rows a job deletes or marks per statement. */
  sweepBatchSize: number;
  /** Where the metrics and health server listens (src/ops/ops-server.ts). */
  metricsHost: string;
  /** A port (0: any free one), 'off', or undefined: the entry point's default (DEFAULT_METRICS_PORTS). */
  metricsPort: number | 'off' | undefined;
  /** How long a stopping daemon lets work in flight finish before cutting it off (SIGTERM). */
  shutdownGraceSeconds: number;
  logLevel: LogLevel;
  /** HEAP_FLAGS: `off` runs milter, lmtp and all with V8's defaults (src/heap-flags.ts). */
  heapFlags: 'on' | 'off';
}

/** A TCP address on this host, or a unix socket path. */
export type Listen = { host: string; port: number } | { path: string };

export function describeListen(listen: Listen): string {
  return 'path' in listen ? `unix:${listen.path}` : `inet:${listen.host}:${listen.port}`;
}

export class ConfigError extends Error {
  readonly variable: string;
  constructor(variable: string, message: string) {
    super(`${variable}: ${message}`);
    this.variable = variable;
  }
}

type Env = Record<string, string | undefined>;

const positiveInt = Compile(Type.Integer({ minimum: 1 }));
const nonNegativeInt = Compile(Type.Integer({ minimum: 0 }));

/**
 * A DNS name (letters, digits, hyphens; dot-separated labels), as MAIL_DOMAIN and Postfix's myhostname
 * must be.
 */
export const HOST_NAME =
  /^(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$/i;

function hostName(env: Env, name: string, fallback: string): string {
  const value = text(env, name, fallback);
  if (!HOST_NAME.test(value)) throw new ConfigError(name, `must be a host name (got "${value}")`);
  return value;
}

/**
 * A PostgreSQL connection string in a form node-postgres reads: a URL (postgres:, postgresql: or
 * socket:; like node-postgres, one with no host before its path, `postgres://user@/db`, is read as if
 * it had one), or `/socket/dir database`. Never echoed, since it may carry a password.
 */
function databaseUrl(env: Env, name: string, fallback: string): string {
  const value = text(env, name, fallback);
  if (value.startsWith('/')) return value;
  const parse = (candidate: string) => {
    try {
      return new URL(candidate);
    } catch {
      return undefined;
    }
  };
  const parsed = parse(value) ?? parse(value.replace('@/', '@localhost/'));
  if (!parsed) {
    throw new ConfigError(name, 'is not a valid URL (percent-encode / # ? % in the user name or password)');
  }
  if (!['postgres:', 'postgresql:', 'socket:'].includes(parsed.protocol)) {
    throw new ConfigError(name, 'must be a postgres://, postgresql:// or socket: URL');
  }
  return value;
}

function text(env: Env, name: string, fallback?: string): string {
  const value = env[name];
  if (value === undefined || value === '') {
    if (fallback === undefined) throw new ConfigError(name, 'is required');
    return fallback;
  }
  return value;
}

function oneOf<T extends string>(env: Env, name: string, allowed: readonly T[], fallback: T): T {
  const value = text(env, name, fallback);
  if (!(allowed as readonly string[]).includes(value)) {
    throw new ConfigError(name, `must be one of ${allowed.join(', ')} (got "${value}")`);
  }
  return value as T;
}

function integer(env: Env, name: string, fallback: number, allowZero = false): number {
  const raw = text(env, name, String(fallback));
  const value = /^-?\d+$/.test(raw) ? Number(raw) : Number.NaN;
  const check = allowZero ? nonNegativeInt : positiveInt;
  if (!Number.isSafeInteger(value) || !check.Check(value)) {
    throw new ConfigError(name, `must be an integer ${allowZero ? '>= 0' : '>= 1'} (got "${raw}")`);
  }
  return value;
}

/** A positive integer no larger than its default. */
function atMost(env: Env, name: string, max: number): number {
  const value = integer(env, name, max);
  if (value > max) throw new ConfigError(name, `must be at most ${max} (got "${value}")`);
  return value;
}

function rate(env: Env, name: string, fallback: number): number {
  const raw = text(env, name, String(fallback));
  const value = Number(raw);
  if (!/^\d+(\.\d+)?$/.test(raw) || !(value > 0)) {
    throw new ConfigError(name, `must be a positive number (got "${raw}")`);
  }
  return value;
}

function url(env: Env, name: string, fallback: string): string {
  const raw = text(env, name, fallback);
  let parsed: URL;
  try {
    parsed = new URL(raw);
  } catch {
    throw new ConfigError(name, `must be an absolute http(s) URL (got "${raw}")`);
  }
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') {
    throw new ConfigError(name, `must be an absolute http(s) URL (got "${raw}")`);
  }
  return raw.replace(/\/+$/, '');
}

function port(env: Env, name: string, fallback: number): number {
  const value = integer(env, name, fallback, true);
  if (value > 65535) throw new ConfigError(name, `must be a port number (got "${value}")`);
  return value;
}

/** sun_path holds 108 bytes with its terminating NUL (unix(7)). */
const MAX_SOCKET_PATH_BYTES = 107;

/**
 * `PORT`, `HOST:PORT` or an absolute unix socket path; a bare port listens on 127.0.0.1. A path is
 * written into Postfix's main.cf (`unix:PATH` inside `{ ... }` lists), so it may not hold what would
 * split it there.
 */
function listen(env: Env, name: string, fallback: number): Listen {
  const raw = text(env, name, String(fallback));
  if (raw.startsWith('/')) {
    if (/[\s,{}=]/.test(raw)) {
      throw new ConfigError(
        name,
        `a socket path may not contain whitespace, ",", "{", "}" or "=" (got "${raw}")`,
      );
    }
    if (Buffer.byteLength(raw) > MAX_SOCKET_PATH_BYTES) {
      throw new ConfigError(
        name,
        `a socket path may be at most ${MAX_SOCKET_PATH_BYTES} bytes (got "${raw}")`,
      );
    }
    return { path: raw };
  }
  const match = /^(?:(\[[0-9a-f:.]+\]|[^:]+):)?(\d{1,5})$/i.exec(raw);
  const portNumber = Number(match?.[2]);
  const host = (match?.[1] ?? '127.0.0.1').replace(/^\[|\]$/g, '');
  // The host is written into main.cf's `{ inet:HOST:PORT, ... }` lists too: nothing but an address or
  // a name, so a value cannot close the list and add settings of its own.
  if (!match || portNumber > 65535 || (isIP(host) === 0 && !HOST_NAME.test(host))) {
    throw new ConfigError(name, `must be a port, host:port or an absolute socket path (got "${raw}")`);
  }
  return { host, port: portNumber };
}

/** Unset: the entry point's default; `off`: no metrics server; else a port (0: any free one). */
function metricsPort(env: Env, name: string): number | 'off' | undefined {
  const raw = env[name];
  if (raw === undefined || raw === '') return undefined;
  if (raw.toLowerCase() === 'off') return 'off';
  if (!/^\d{1,5}$/.test(raw) || Number(raw) > 65535) {
    throw new ConfigError(name, `must be a port number or off (got "${raw}")`);
  }
  return Number(raw);
}

/**
 * Text that goes into an SMTP reply as given: printable US-ASCII (RFC 5321 section 4.2), short enough
 * for the 512-byte reply line. A line break would end the policy daemon's reply early and makes the
 * milter answer a temporary failure instead of the refusal.
 */
function replyText(name: string, value: string): string {
  if (!/^[\x20-\x7e]{1,200}$/.test(value)) {
    throw new ConfigError(name, `must be 1 to 200 printable ASCII characters (got ${JSON.stringify(value)})`);
  }
  return value;
}

function bool(env: Env, name: string, fallback: boolean): boolean {
  const raw = text(env, name, String(fallback)).toLowerCase();
  if (['true', '1', 'yes'].includes(raw)) return true;
  if (['false', '0', 'no'].includes(raw)) return false;
  throw new ConfigError(name, `must be true or false (got "${raw}")`);
}

/** An address dns.setServers takes: an IP, `IPv4:port`, or `[IPv6]` with an optional `:port`. */
function resolverAddress(server: string): boolean {
  if (isIP(server) !== 0) return true;
  const match = /^(?:\[([^\]]+)\]|([\d.]+))(?::(\d{1,5}))?$/.exec(server);
  if (!match || Number(match[3] ?? 53) > 65535 || Number(match[3] ?? 53) === 0) return false;
  return match[1] !== undefined ? isIPv6(match[1]) : isIPv4(match[2] ?? '');
}

function dnsServers(raw: string): string[] {
  const servers = raw
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  if (servers.length === 0 || !servers.every(resolverAddress)) {
    throw new ConfigError(
      'DNS_SERVERS',
      `must be comma-separated IP addresses, each with an optional port (1.2.3.4:53, [::1]:53) (got "${raw}")`,
    );
  }
  return servers;
}

/** Where Postfix listens for SMTP: `*` (every address), an IP address or a host name. */
function smtpHost(env: Env, name: string, fallback: string): string {
  const value = text(env, name, fallback);
  if (value !== '*' && isIP(value) === 0 && !HOST_NAME.test(value)) {
    throw new ConfigError(name, `must be an IP address, a host name or * (got "${value}")`);
  }
  return value;
}

/** The contract's limit (section 8: a single inbound message is at most 25 MiB); lower is allowed. */
export const CONTRACT_MAX_MESSAGE_BYTES = 26214400;

/** Seconds that divide a minute, whole minutes that divide an hour, or whole hours that divide a day. */
function sweepInterval(env: Env, name: string, fallback: number): number {
  const value = integer(env, name, fallback);
  const fits = (unit: number, per: number) => value % unit === 0 && per % (value / unit) === 0;
  if (!(value < 60 ? 60 % value === 0 : fits(60, 60) || fits(3600, 24))) {
    throw new ConfigError(
      name,
      `must divide a minute, an hour or a day evenly, e.g. 30, 60, 300 (got "${value}")`,
    );
  }
  return value;
}

// smtp-server's own conversion of a recipient's domain (the same package and version it uses).
const punycode = createRequire(import.meta.url)('punycode.js') as { toUnicode(domain: string): string };

/**
 * Whether a domain comes back as itself after smtp-server's punycode.toUnicode and domainToASCII
 * (inMailDomain): not `xn--abc.example` (no valid A-label: `.example`), `xn--9999.example` (throws),
 * `127.1` (an address) or `inbox.123`.
 */
function survivesUnicode(domain: string): boolean {
  try {
    return domainToASCII(punycode.toUnicode(domain)) === domain;
  } catch {
    return false;
  }
}

/** Reads and checks the environment. Throws ConfigError naming the first bad variable. */
export function loadConfig(env: Env = process.env): Config {
  const environment = oneOf(env, 'ENVIRONMENT', ['dev', 'prod'] as const, 'dev');
  const prod = environment === 'prod';
  const provisioning = oneOf(env, 'PROVISIONING', ['open', 'closed'] as const, prod ? 'closed' : 'open');
  const apiHost = text(env, 'API_HOST', '127.0.0.1');
  const apiPort = integer(env, 'API_PORT', 8080, true);
  if (apiPort > 65535) throw new ConfigError('API_PORT', `must be a port number (got "${apiPort}")`);
  const mailDomain = text(env, 'MAIL_DOMAIN', prod ? undefined : 'localhost').toLowerCase();
  if (!HOST_NAME.test(mailDomain))
    throw new ConfigError('MAIL_DOMAIN', `must be a domain name (got "${mailDomain}")`);
  // The receiver gets each recipient's domain from smtp-server in Unicode and reads it back into
  // A-labels (core/mail-address.ts inMailDomain): a name that does not survive that
  // (`xn--abc.example` is no valid A-label, `127.1` reads as an address) would have every message
  // answered 250 and stored nowhere.
  if (!survivesUnicode(mailDomain))
    throw new ConfigError('MAIL_DOMAIN', `must be a domain name in its ASCII form (got "${mailDomain}")`);
  // An address is the 20-character inbox id, `@` and the domain; smtp-server refuses a path over 253.
  if (mailDomain.length > 232)
    throw new ConfigError('MAIL_DOMAIN', `must be at most 232 characters (got ${mailDomain.length})`);
  const secretKey = env.SECRET_KEY === undefined || env.SECRET_KEY === '' ? undefined : env.SECRET_KEY;
  if (secretKey !== undefined && secretKey.length < 32) {
    throw new ConfigError('SECRET_KEY', 'must be at least 32 characters');
  }
  if (secretKey === undefined && prod)
    throw new ConfigError('SECRET_KEY', 'is required when ENVIRONMENT=prod');
  const unitSeconds = integer(env, 'UNIT_SECONDS', 3600);
  const config: Config = {
    environment,
    provisioning,
    databaseUrl: databaseUrl(env, 'DATABASE_URL', 'postgres://postgres@127.0.0.1:5432/inbox'),
    apiHost,
    apiPort,
    publicBaseUrl: url(
      env,
      'PUBLIC_BASE_URL',
      `http://${apiHost.includes(':') ? `[${apiHost}]` : apiHost}:${apiPort}`,
    ),
    mailDomain,
    // The default is abuse@MAIL_DOMAIN, a host name already checked: only a value set is limited.
    abuseContact: env.ABUSE_CONTACT ? replyText('ABUSE_CONTACT', env.ABUSE_CONTACT) : `abuse@${mailDomain}`,
    secretKey,
    runDir: text(env, 'RUN_DIR', '.run'),
    unitSeconds,
    quotaBytes: integer(env, 'QUOTA_BYTES', 104857600, true),
    downloadGraceSeconds: integer(env, 'DOWNLOAD_GRACE_SECONDS', 300),
    unclaimedSeconds: integer(env, 'UNCLAIMED_SECONDS', 3600),
    goneSeconds: integer(env, 'GONE_SECONDS', 3600),
    purgeAfterSeconds: integer(env, 'PURGE_AFTER_SECONDS', 1200),
    rejectionRetentionSeconds: integer(env, 'REJECTION_RETENTION_SECONDS', 3600),
    maxRejections: integer(env, 'MAX_REJECTIONS', 100, true),
    idempotencyTtlSeconds: integer(env, 'IDEMPOTENCY_TTL_SECONDS', 86400),
    pollRateBurst: integer(env, 'POLL_RATE_BURST', 120),
    pollRatePerSecond: rate(env, 'POLL_RATE_PER_SECOND', 0.5),
    downloadRateBurst: integer(env, 'DOWNLOAD_RATE_BURST', 100),
    downloadRatePerSecond: rate(env, 'DOWNLOAD_RATE_PER_SECOND', 2),
    smtpHost: smtpHost(env, 'SMTP_HOST', '127.0.0.1'),
    smtpPort: port(env, 'SMTP_PORT', 2525),
    policyListen: listen(env, 'POLICY_PORT', 10040),
    milterListen: listen(env, 'MILTER_PORT', 10041),
    lmtpListen: listen(env, 'LMTP_PORT', 10042),
    authservId: hostName(env, 'AUTHSERV_ID', `mx.${mailDomain}`).toLowerCase(),
    dnsServers: text(env, 'DNS_SERVERS', '-') === '-' ? [] : dnsServers(env.DNS_SERVERS as string),
    requirePtr: bool(env, 'REQUIRE_PTR', true),
    maxMessageBytes: atMost(env, 'MAX_MESSAGE_BYTES', CONTRACT_MAX_MESSAGE_BYTES),
    sweepIntervalSeconds: sweepInterval(env, 'SWEEP_INTERVAL_SECONDS', 60),
    // Postfix's maximal_queue_lifetime (5 days, postfix/main.cf) plus a day of slack.
    reservationTtlSeconds: integer(env, 'RESERVATION_TTL_SECONDS', 518400),
    sweepBatchSize: integer(env, 'SWEEP_BATCH_SIZE', 500),
    metricsHost: text(env, 'METRICS_HOST', '127.0.0.1'),
    metricsPort: metricsPort(env, 'METRICS_PORT'),
    shutdownGraceSeconds: integer(env, 'SHUTDOWN_GRACE_SECONDS', 30),
    logLevel: oneOf(env, 'LOG_LEVEL', LOG_LEVELS, 'info'),
    heapFlags: oneOf(env, 'HEAP_FLAGS', ['on', 'off'] as const, 'on'),
  };
  return config;
}
