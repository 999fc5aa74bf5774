/**
 * cursor - a position in an inbox's event sequence (DESIGN decision 8): `1.` + base36 position.
 *
 * Only canonical forms are accepted: a cursor the service could not have issued (leading zeros,
 * past the safe integer range) is not a cursor.
 */
const CURSOR = /^1\.[0-9a-z]{1,11}$/;

export function encodeCursor(position: number): string {
  return `1.${position.toString(36)}`;
}

/** The position, or undefined when the string is not a cursor this service issues. */
export function decodeCursor(cursor: string): number | undefined {
  if (!CURSOR.test(cursor)) return undefined;
  const digits = cursor.slice(2);
  const position = Number.parseInt(digits, 36);
  if (!Number.isSafeInteger(position) || position.toString(36) !== digits) return undefined;
  return position;
}
