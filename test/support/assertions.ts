/**
 * assertions - helpers shared by the API test files: the error-body check, ISO time arithmetic, and
 * the sender-domain examples of contract section 2.
 */
import assert from 'node:assert/strict';
import type { ApiResponse } from './harness.ts';

/**
 * Asserts that `response` is the error `code` with HTTP `status` (section 7's error body: `error.code`
 * and a string `error.message`) and returns `error.details`, or `{}` when there are none.
 */
export function expectError(response: ApiResponse, status: number, code: string): Record<string, unknown> {
  assert.equal(response.status, status, `${code}: ${response.text}`);
  assert.equal(response.json.error.code, code, response.text);
  assert.equal(typeof response.json.error.message, 'string', response.text);
  return response.json.error.details ?? {};
}

/** `date` as the API writes times. */
export const iso = (date: Date): string => date.toISOString();

/** The ISO time `seconds` after `isoTime`. */
export const plus = (isoTime: string, seconds: number): string =>
  new Date(Date.parse(isoTime) + seconds * 1000).toISOString();

/** A name of exactly `length` characters: three 63-character labels and a last label of the rest. */
export const domainOfLength = (length: number): string =>
  `${'a'.repeat(63)}.${'b'.repeat(63)}.${'c'.repeat(63)}.${'d'.repeat(length - 192)}`;

/** [sent, stored] pairs of section 2's valid sender-domain forms. */
export const VALID_SENDER_DOMAINS: [string, string][] = [
  ['example.com', 'example.com'],
  ['EXAMPLE.COM', 'example.com'],
  ['Mail.Example.Org', 'mail.example.org'],
  ['example.com.', 'example.com'],
  ['xn--bcher-kva.example', 'xn--bcher-kva.example'],
  ['XN--BCHER-KVA.example', 'xn--bcher-kva.example'],
  ['a.co', 'a.co'],
  ['my-host.example-domain.com', 'my-host.example-domain.com'],
  ['123.example', '123.example'],
  ['1.2.3.example', '1.2.3.example'],
  [`${'a'.repeat(63)}.com`, `${'a'.repeat(63)}.com`],
  [`example.${'b'.repeat(63)}`, `example.${'b'.repeat(63)}`],
  [domainOfLength(254), domainOfLength(254)],
];

/** sender_domains entries that are not domain names under section 2. */
export const INVALID_SENDER_DOMAINS: unknown[] = [
  'localhost',
  'com.',
  '.',
  '',
  `${'a'.repeat(64)}.com`,
  `example.${'b'.repeat(64)}`,
  '-example.com',
  'example-.com',
  'mail.-example.com',
  'example.com-',
  'example.c',
  domainOfLength(255),
  '.example.com',
  'example..com',
  'example.com..',
  'exa_mple.com',
  'ex ample.com',
  ' example.com',
  'example.com ',
  'bücher.example',
  '*.example.com',
  'user@example.com',
  'example.com/path',
  'http://example.com',
  42,
  null,
  true,
  {},
  ['example.com'],
];
