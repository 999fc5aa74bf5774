/**
 * fast-linebreaks: the same chunks and the same carried state as mailauth's own ensureLinebreaks, on
 * inputs built to hit every case (bare LF first, last, after CRLF, after LF; CR at a chunk's end and
 * LF at the next one's start) and on random ones. DKIM through the milter, which runs with the
 * replacement installed, is tested end to end in authentication.test.ts.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { installFastLinebreaks, linebreakChunks } from '../../src/mail/fast-linebreaks.ts';

const mailauthOwn = installFastLinebreaks();

/** Runs one parser's pass over a sequence of inputs, as the parser does: state carried between them. */
function run(pass: typeof linebreakChunks, inputs: Buffer[]) {
  const state: { lastByte?: number } = {};
  const out: string[] = [];
  for (const input of inputs) {
    for (const chunk of pass.call(state, input)) out.push(chunk.toString('latin1'));
  }
  return { out, lastByte: state.lastByte };
}

const cases: string[][] = [
  ['\n'],
  ['a\nb'],
  ['a\r\nb\n'],
  ['\n\n\n'],
  ['\r\n\n'],
  ['line\r', '\nnext\n'],
  ['line', '\n', '\r\n', '\n'],
  ['\r', '\r\n', 'x\r', '\r', '\n'],
  ['no line breaks at all'],
  ['ends in CR\r'],
];

test('the same chunks and state as mailauth on every edge case', () => {
  for (const texts of cases) {
    const inputs = texts.map((t) => Buffer.from(t, 'latin1'));
    assert.deepEqual(run(linebreakChunks, inputs), run(mailauthOwn, inputs), JSON.stringify(texts));
  }
});

test('the same chunks and state as mailauth on random inputs of CR, LF and text', () => {
  let seed = 7;
  const random = (n: number) => {
    seed = (seed * 1103515245 + 12345) % 2 ** 31;
    return seed % n;
  };
  const alphabet = ['\r', '\n', '\r\n', 'a', 'bc', ' '];
  for (let round = 0; round < 500; round++) {
    const inputs = Array.from({ length: 1 + random(5) }, () =>
      Buffer.from(
        Array.from({ length: random(12) }, () => alphabet[random(alphabet.length)]).join(''),
        'latin1',
      ),
    );
    assert.deepEqual(run(linebreakChunks, inputs), run(mailauthOwn, inputs));
  }
});

test("installing it replaces mailauth's method and is idempotent", () => {
  assert.equal(installFastLinebreaks(), mailauthOwn);
  assert.notEqual(mailauthOwn, linebreakChunks);
});
