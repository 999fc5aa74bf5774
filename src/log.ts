/**
 * log - structured logs: one JSON object per line on stdout, written by pino.
 *
 * Every line has `level` (debug, info, warn, error), `time` (ISO 8601, UTC), `daemon`, `pid` and `msg`,
 * then the caller's fields in snake_case: `request_id` (API), `queue_id` (Postfix's, on the mail side),
 * `inbox_id` or `inbox_ids` where known.
 *
 * Contract for callers: never pass message content (bodies, subjects, header values) or a credential
 * (Authorization, tokens, SECRET_KEY). As a second line of defence, fields named like a credential are
 * replaced by `[redacted]` (REDACTED_FIELDS: top-level names and `headers.*`; pino's wildcard paths
 * would cost more than the rest of a line's writing, about 5 us each time).
 *
 * Lines are written synchronously (process.stdout is synchronous for files and pipes on Linux), so a
 * process that exits right after logging loses nothing.
 */
import pino from 'pino';

export type LogLine = Record<string, unknown>;
export type Log = (line: LogLine) => void;

export const LOG_LEVELS = ['debug', 'info', 'warn', 'error'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

/** Fields whose values are never written, whoever passes them. */
export const REDACTED_FIELDS = [
  'authorization',
  'credentials',
  'password',
  'secret',
  'secret_key',
  'token',
  'cookie',
  'headers.authorization',
  'headers.cookie',
] as const;

export function createLog(
  daemon: string,
  write: (text: string) => void = (text) => process.stdout.write(text),
  level: LogLevel = 'info',
): Log {
  const logger = pino(
    {
      level,
      base: { daemon, pid: process.pid },
      messageKey: 'msg',
      timestamp: pino.stdTimeFunctions.isoTime,
      formatters: { level: (label) => ({ level: label }) },
      redact: {
        paths: [...REDACTED_FIELDS],
        censor: '[redacted]',
      },
    },
    { write },
  );
  return (line) => {
    const { level: wanted, msg, ...fields } = line;
    const method = LOG_LEVELS.includes(wanted as LogLevel) ? (wanted as LogLevel) : 'info';
    logger[method](fields, typeof msg === 'string' ? msg : String(msg ?? ''));
  };
}
