/**
 * soak-mail - the crash soak's messages, each made again from its number alone (so nothing sent is
 * kept in memory to compare the stored bytes with).
 *
 * Sizes: mostly a few KiB, some tens of KiB, one in twenty between 200 KiB and 1.5 MiB (streamed in
 * chunks by the receiver). About one in seven goes to two inboxes (one transaction, two rows). Bodies
 * have lines that start with a dot (dot-stuffing on every hop) and are all ASCII, so no hop rewrites
 * them: what was sent is the end of what is stored, after the headers the hops prepend.
 */
import { seededRandom } from '../support/seeded-random.ts';

export interface SoakMessage {
  /** The Message-ID without angle brackets. */
  messageId: string;
  /** Indexes into the soak's inboxes. */
  inboxes: number[];
  bytes: Buffer;
}

/** A Message-ID as the summary and the API give it (`<...>`), without its angle brackets. */
export const bareMessageId = (id: string | null): string => (id ?? '').replace(/^<|>$/g, '');

const LETTERS = 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,-';

export function soakMessage(run: string, seed: number, n: number, inboxCount: number): SoakMessage {
  const random = seededRandom(seed * 1_000_003 + n);
  const first = Math.floor(random() * inboxCount);
  const second = (first + 1 + Math.floor(random() * (inboxCount - 1))) % inboxCount;
  const inboxes = inboxCount > 1 && random() < 0.15 ? [first, second] : [first];
  const roll = random();
  const size =
    roll < 0.7
      ? 1024 + Math.floor(random() * 7 * 1024)
      : roll < 0.95
        ? 10_240 + Math.floor(random() * 50 * 1024)
        : 200 * 1024 + Math.floor(random() * 1300 * 1024);
  const messageId = `soak-${run}-${n}@allowed.test`;
  const header = [
    'From: Soak Sender <sender@allowed.test>',
    `To: ${inboxes.map((i) => `inbox${i}@soak.invalid`).join(', ')}`,
    `Subject: soak message ${n}`,
    `Message-ID: <${messageId}>`,
    'Date: Wed, 25 Nov 2026 12:00:00 +0000',
    'MIME-Version: 1.0',
    'Content-Type: text/plain; charset=us-ascii',
    '',
    '',
  ].join('\r\n');
  const lines: string[] = [];
  let length = header.length;
  while (length < size) {
    const width = 1 + Math.floor(random() * 76);
    let line = random() < 0.05 ? '.' : '';
    while (line.length < width) line += LETTERS[Math.floor(random() * LETTERS.length)];
    lines.push(line);
    length += line.length + 2;
  }
  return { messageId, inboxes, bytes: Buffer.from(`${header}${lines.join('\r\n')}\r\n`, 'latin1') };
}
