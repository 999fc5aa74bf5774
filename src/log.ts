/**
 * log - one JSON object per line on stdout. Never pass message content or credentials.
 */
export type LogLine = Record<string, unknown>;
export type Log = (line: LogLine) => void;

export function createLog(
  daemon: string,
  write: (text: string) => void = (text) => process.stdout.write(text),
): Log {
  return (line) =>
    write(`${JSON.stringify({ time: new Date().toISOString(), level: 'info', daemon, ...line })}\n`);
}
