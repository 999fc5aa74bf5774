/**
 * The DATA scanner (src/lmtp/data-scan.ts) against smtp-server's own, as the oracle: the same input cut
 * into pieces at random must give the same message bytes, the same byte counts and the same commands
 * after the data, for messages full of the cases that matter (dot-stuffed lines, a lone dot after a bare
 * LF, terminators and stuffed dots straddling piece boundaries, commands pipelined after the data).
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { SMTPStream } from 'smtp-server/lib/smtp-stream.js';
import { dataScan, dataScanStats } from '../../src/lmtp/data-scan.ts';

interface Parser {
  oncommand: (line: Buffer, next?: () => void) => void;
  startDataMode(): import('node:stream').PassThrough & { byteLength: number };
  continue(): void;
  write(chunk: Buffer, callback: () => void): boolean;
  end(callback: () => void): void;
}

interface Transcript {
  events: string[];
  messages: Buffer[];
}

/** Feeds the pieces one at a time (each after the previous was taken) and records what came out. */
async function transcript(pieces: Buffer[]): Promise<Transcript> {
  const parser = new SMTPStream() as Parser;
  const events: string[] = [];
  const messages: Buffer[] = [];
  parser.oncommand = (line, next) => {
    const command = line.toString('latin1');
    events.push(`command ${command}`);
    if (command === 'DATA') {
      const stream = parser.startDataMode();
      const parts: Buffer[] = [];
      stream.on('data', (part: Buffer) => parts.push(part));
      stream.on('end', () => {
        messages.push(Buffer.concat(parts));
        events.push(`data ${stream.byteLength}`);
        // smtp-server's connection calls continue() later, never inside 'end' (it would lose the next one)
        setImmediate(() => parser.continue());
      });
    }
    next?.();
  };
  for (const piece of pieces) await new Promise<void>((resolve) => parser.write(piece, resolve));
  await new Promise<void>((resolve) => parser.end(resolve));
  await new Promise((resolve) => setTimeout(resolve, 5));
  return { events, messages };
}

/** A small deterministic generator (xorshift), so that a failure can be replayed from its seed. */
function random(seed: number): () => number {
  let x = seed || 1;
  return () => {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    return (x >>> 0) / 2 ** 32;
  };
}

const LINES = [
  'plain text line',
  '.',
  '..',
  '...',
  '.x',
  '..x',
  '',
  'a'.repeat(70),
  '.\r',
  'x\n.',
  'x\n..y',
  '\n.\r',
];

/** As a client sends a line: a leading dot doubled (RFC 5321 section 4.5.2); bare LFs left as they are. */
const stuffed = (line: string) => (line.startsWith('.') ? `.${line}` : line);

function session(next: () => number): Buffer {
  const parts: string[] = ['MAIL FROM:<a@b>\r\n'];
  // One message per session: a client waits for 354 after DATA, so no second message can be pipelined
  // (and smtp-server's continue() would lose it).
  parts.push('DATA\r\n');
  if (next() < 0.2) parts.push('..starts stuffed\r\n');
  const count = Math.floor(next() * 300);
  for (let i = 0; i < count; i++)
    parts.push(`${stuffed(LINES[Math.floor(next() * LINES.length)] as string)}\r\n`);
  parts.push('.\r\nRSET\r\nQUIT\r\n');
  return Buffer.from(parts.join(''), 'latin1');
}

function cut(data: Buffer, next: () => number): Buffer[] {
  const pieces: Buffer[] = [];
  for (let at = 0; at < data.length; ) {
    const r = next();
    const size =
      r < 0.3
        ? 1 + Math.floor(next() * 8)
        : r < 0.8
          ? 16 + Math.floor(next() * 200)
          : 1 + Math.floor(next() * 4000);
    pieces.push(Buffer.from(data.subarray(at, at + size)));
    at += size;
  }
  return pieces;
}

test('the scanner installs over this smtp-server version', () => {
  assert.equal(dataScan.install(), true);
});

test('the scanner and smtp-server own give the same transcript on 300 random cuttings', async () => {
  const before = { ...dataScanStats };
  for (let seed = 1; seed <= 300; seed++) {
    const next = random(seed);
    const pieces = cut(session(next), next);
    dataScan.uninstall();
    const expected = await transcript(pieces);
    dataScan.install();
    const actual = await transcript(pieces);
    assert.deepEqual(actual.events, expected.events, `seed ${seed}`);
    assert.deepEqual(actual.events.slice(-2), ['command RSET', 'command QUIT'], `seed ${seed}`);
    for (const [i, m] of actual.messages.entries())
      assert.ok(m.equals(expected.messages[i] as Buffer), `seed ${seed} message ${i}`);
  }
  // Both paths were taken: pieces the scanner handled itself, and those it handed to the original.
  assert.ok(
    dataScanStats.scanned - before.scanned > 1000,
    `scanned ${dataScanStats.scanned - before.scanned}`,
  );
  assert.ok(
    dataScanStats.handedOver - before.handedOver > 1000,
    `handed over ${dataScanStats.handedOver - before.handedOver}`,
  );
});

test('a 1 MiB message in 64 KiB pieces is unstuffed exactly, nearly every piece by the scanner', async () => {
  dataScan.install();
  const lines: string[] = [];
  for (let i = 0, length = 0; length < 1024 * 1024; i++) {
    const line = i % 7 === 0 ? `.line ${i}` : `line ${i} ${'x'.repeat(i % 90)}`;
    lines.push(line);
    length += line.length + 2;
  }
  const body = `${lines.join('\r\n')}\r\n`;
  const data = Buffer.from(`DATA\r\n${body.replace(/^\./gm, '..')}.\r\nQUIT\r\n`, 'latin1');
  const pieces: Buffer[] = [];
  for (let at = 0; at < data.length; at += 65_536) pieces.push(data.subarray(at, at + 65_536));
  const before = { ...dataScanStats };
  const { messages, events } = await transcript(pieces);
  assert.equal(messages[0]?.toString('latin1'), body);
  assert.deepEqual(events.slice(-2), [`data ${Buffer.byteLength(body, 'latin1')}`, 'command QUIT']);
  // The original only gets pieces whose seam has a line-start dot (the first line has none).
  assert.ok(
    dataScanStats.handedOver - before.handedOver <= 4,
    `handed over ${dataScanStats.handedOver - before.handedOver}`,
  );
  assert.ok(
    dataScanStats.scanned - before.scanned >= pieces.length,
    `scanned ${dataScanStats.scanned - before.scanned}`,
  );
});

test('a message that arrives in one piece is scanned by the scanner alone, unless its first line starts with a dot', async () => {
  dataScan.install();
  const body = `Subject: one piece\r\n\r\n${'a line of text\r\n'.repeat(640)}`;
  for (const [first, handedOver] of [
    ['', 0],
    ['..first line starts with a dot\r\n', 1],
  ] as const) {
    const sent = `${first}${body}`;
    const before = { ...dataScanStats };
    const { messages } = await transcript([Buffer.from(`DATA\r\n${sent}.\r\nQUIT\r\n`, 'latin1')]);
    assert.equal(messages[0]?.toString('latin1'), sent.replace(/^\.\./, '.'));
    assert.equal(
      dataScanStats.handedOver - before.handedOver,
      handedOver,
      `first line ${JSON.stringify(first)}`,
    );
  }
});

test('a piece with many stuffed dots is unstuffed in one pass, not re-entered once per dot', async () => {
  dataScan.install();
  // 1 MiB of short lines that each start with a dot: until 2026-11-25 each dropped dot sent the rest
  // of its piece through setImmediate and the whole entry again (18 times slower than without dots).
  const lines = Array.from({ length: 100_000 }, (_, i) => `.${i % 10}`);
  const body = `${lines.join('\r\n')}\r\n`;
  const data = Buffer.from(`DATA\r\n${body.replace(/^\./gm, '..')}.\r\nQUIT\r\n`, 'latin1');
  const pieces: Buffer[] = [];
  for (let at = 0; at < data.length; at += 65_536) pieces.push(data.subarray(at, at + 65_536));
  const before = { ...dataScanStats };
  const { messages } = await transcript(pieces);
  assert.equal(messages[0]?.toString('latin1'), body);
  const entries = dataScanStats.scanned - before.scanned + (dataScanStats.handedOver - before.handedOver);
  // A few per piece (a seam with a line-start dot goes to the original, which hands its rest back).
  assert.ok(entries <= pieces.length * 10, `${entries} entries for ${pieces.length} pieces`);
});

test('an empty message whose end marker is cut after its dot, at the start of DATA, ends as the original says', async () => {
  const filler = `${'x'.repeat(30)}\r\n`;
  for (const cuts of [
    ['DATA\r\n', '.', `\r\nRSET\r\nQUIT\r\n${filler}`],
    ['DATA\r\n', '.\r', `\nRSET\r\nQUIT\r\n${filler}`],
  ]) {
    const pieces = cuts.map((c) => Buffer.from(c, 'latin1'));
    dataScan.uninstall();
    const expected = await transcript(pieces);
    dataScan.install();
    const actual = await transcript(pieces);
    assert.deepEqual(actual.events, expected.events, JSON.stringify(cuts));
    assert.deepEqual(actual.events.slice(0, 3), ['command DATA', 'data 0', 'command RSET']);
  }
});
