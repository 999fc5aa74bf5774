/**
 * fast-relaxed-body: mailauth's RelaxedHash with our update and with its own, fed the same chunks, make
 * the same calls to _pushBodyHash (the same bytes, in the same order), keep the same remainder and
 * counts, and give the same body hash, with and without an l= limit: on inputs built to hit every
 * case (tabs, runs of spaces, a space before CRLF, bare LF first and last, a line split across chunks,
 * a last line without a break) and on random ones. DKIM through the milter, which runs with the
 * replacement installed, is tested end to end in authentication.test.ts and mailauth-body.test.ts.
 */
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { test } from 'node:test';
import {
  installFastRelaxedBody,
  LONG_LINE_BYTES,
  relaxedUpdate,
  relaxedUpdateSettling,
} from '../../src/mail/fast-relaxed-body.ts';

const mailauthOwn = installFastRelaxedBody();
const { RelaxedHash } = createRequire(import.meta.url)('mailauth/lib/dkim/body/relaxed.js') as {
  RelaxedHash: new (algorithm?: string, maxBodyLength?: number) => Record<string, unknown>;
};

type Update = typeof relaxedUpdate;

/** One hasher's run over `inputs` with `update`: every piece pushed, the state after each input, the hash. */
function run(update: Update, inputs: Buffer[], maxBodyLength?: number) {
  const hash = new RelaxedHash('sha256', maxBodyLength);
  const pushed: string[] = [];
  const push = hash._pushBodyHash as (chunk: Buffer) => void;
  hash._pushBodyHash = function recorded(chunk: Buffer) {
    pushed.push(chunk.toString('latin1'));
    push.call(this, chunk);
  };
  hash.update = update;
  const states: unknown[] = [];
  for (const input of inputs) {
    (hash.update as Update).call(hash as never, input);
    const remainder = hash.remainder as Buffer | false;
    states.push([
      remainder === false ? false : remainder.toString('latin1'),
      hash.byteLength,
      hash.canonicalizedLength,
    ]);
  }
  const digest = (hash.digest as (encoding: string) => string).call(hash, 'base64');
  return { pushed, states, digest, bodyHashedBytes: hash.bodyHashedBytes };
}

const cases: string[][] = [
  [''],
  ['plain line\r\n'],
  ['a\tb\r\n', 'c  d\r\n', 'e \r\n', 'f\r\n'],
  ['\n', 'x\n', '\r\n\r\n', '\n'],
  ['line with\ttab and  spaces \r\n\r\n\r\n'],
  ['split across ', 'chunks  here\r', '\nnext\r\n'],
  ['no break at the end'],
  ['ends in a space '],
  ['ends in a\ttab'],
  ['ends  spaced'],
  ['ok\r\n', 'ok\r\n', 'tail  '],
  ['\r\n', '\r\n', ' \r\n'],
  [' \t \r\n \r\n', '\t\r\n'],
  ['bare CR \r in a line\r\n', 'x\r'],
];

test('the same pieces, state and hash as mailauth on every edge case', () => {
  for (const texts of cases) {
    const inputs = texts.map((t) => Buffer.from(t, 'latin1'));
    for (const limit of [undefined, 0, 3, 10]) {
      assert.deepEqual(
        run(relaxedUpdate, inputs, limit),
        run(mailauthOwn as Update, inputs, limit),
        `${JSON.stringify(texts)} l=${limit}`,
      );
    }
  }
});

test('the same pieces, state and hash as mailauth on random inputs of spaces, tabs, CR, LF and text', () => {
  let seed = 11;
  const random = (n: number) => {
    seed = (seed * 1103515245 + 12345) % 2 ** 31;
    return seed % n;
  };
  const alphabet = ['\r', '\n', '\r\n', ' ', '  ', '\t', ' \r\n', 'a', 'bc', 'XXXXXXXX'];
  for (let round = 0; round < 2000; round++) {
    const inputs = Array.from({ length: 1 + random(5) }, () =>
      Buffer.from(
        Array.from({ length: random(16) }, () => alphabet[random(alphabet.length)]).join(''),
        'latin1',
      ),
    );
    const limit = random(3) === 0 ? random(40) : undefined;
    assert.deepEqual(run(relaxedUpdate, inputs, limit), run(mailauthOwn as Update, inputs, limit));
  }
});

test('a 1 MiB body in 64 KiB chunks: the same pieces and hash', () => {
  const lines = Array.from({ length: 14000 }, (_, i) =>
    i % 97 === 0 ? `indented\t line ${i}  with  runs \r\n` : `${i % 10}${'X'.repeat(76)}\r\n`,
  );
  const body = Buffer.from(lines.join(''), 'latin1');
  const inputs: Buffer[] = [];
  for (let at = 0; at < body.length; at += 65535) inputs.push(body.subarray(at, at + 65535));
  assert.deepEqual(run(relaxedUpdate, inputs), run(mailauthOwn as Update, inputs));
});

test('long unfinished lines settled early (here past 3 bytes) give the same hash and counts as mailauth on random inputs', () => {
  const settling = relaxedUpdateSettling(3);
  let seed = 29;
  const random = (n: number) => {
    seed = (seed * 1103515245 + 12345) % 2 ** 31;
    return seed % n;
  };
  const alphabet = [
    '\r',
    '\n',
    '\r\n',
    ' ',
    '  ',
    '\t',
    ' \r\n',
    'a',
    'bc',
    'XXXXXXXX',
    '\r ',
    ' \r',
    '   \t ',
  ];
  for (let round = 0; round < 3000; round++) {
    const inputs = Array.from({ length: 1 + random(6) }, () =>
      Buffer.from(
        Array.from({ length: random(16) }, () => alphabet[random(alphabet.length)]).join(''),
        'latin1',
      ),
    );
    const limit = random(3) === 0 ? random(40) : undefined;
    const ours = run(settling, inputs, limit);
    const theirs = run(mailauthOwn as Update, inputs, limit);
    assert.equal(ours.digest, theirs.digest, JSON.stringify(inputs.map((b) => b.toString('latin1'))));
    assert.equal(ours.bodyHashedBytes, theirs.bodyHashedBytes);
  }
});

test('a body that is one long line keeps at most a chunk and LONG_LINE_BYTES waiting, and hashes as mailauth does', () => {
  const words = Array.from({ length: 200_000 }, (_, i) => (i % 7 === 0 ? 'word\t\t' : 'word  '));
  // Words; then white space alone (nothing to settle it on), CRs among it; a line of white space only.
  const bodies = [
    `${words.join('')}end \r\n`,
    `x${' '.repeat(1_000_000)}\r\n`,
    `x${' \r\t'.repeat(300_000)}y\r\n`,
    `${' '.repeat(1_000_000)}\r\nnext\r\n`,
    `${'\r'.repeat(300_000)}\n`,
  ];
  for (const text of bodies) {
    const body = Buffer.from(text, 'latin1');
    const inputs: Buffer[] = [];
    for (let at = 0; at < body.length; at += 65535) inputs.push(body.subarray(at, at + 65535));
    const ours = run(relaxedUpdate, inputs);
    const longest = Math.max(...ours.states.map((state) => ((state as [string | false])[0] || '').length));
    assert.ok(longest <= LONG_LINE_BYTES + 65535, `${longest} bytes waited`);
    assert.equal(ours.digest, run(mailauthOwn as Update, inputs).digest, JSON.stringify(text.slice(0, 20)));
  }
});

test("installing it replaces mailauth's method and is idempotent", () => {
  assert.equal(installFastRelaxedBody(), mailauthOwn);
  assert.notEqual(mailauthOwn, relaxedUpdate);
  assert.equal(new RelaxedHash().update, relaxedUpdate);
});

test('installing refuses a mailauth whose RelaxedHash lacks a helper our update calls', () => {
  const prototype = RelaxedHash.prototype as Record<string, unknown>;
  const helper = prototype.fixLineBuffer;
  delete prototype.fixLineBuffer;
  try {
    assert.throws(() => installFastRelaxedBody(), /RelaxedHash no longer has fixLineBuffer/);
  } finally {
    prototype.fixLineBuffer = helper;
  }
  assert.equal(installFastRelaxedBody(), mailauthOwn);
});
