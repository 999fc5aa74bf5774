/**
 * fast-relaxed-body - a faster pass for mailauth's DKIM "relaxed" body canonicalization (RFC 6376
 * 3.4.4), the canonicalization nearly every DKIM signer uses.
 *
 * mailauth's RelaxedHash#update decides, line by line, whether a line must be rewritten (a tab, a run
 * of spaces, a space before the line break, a bare LF) by looking at every byte of the body in a JS
 * loop: about 2.8 ms per MiB, most of the milter's CPU for a DKIM-signed 1 MiB message
 * (milter-check-bench). `relaxedUpdate` makes the same decisions from Buffer#indexOf: the line breaks,
 * and the next tab and the next two spaces, each searched for once per occurrence, not per byte. It
 * hands mailauth's own helpers (_pushBodyHash, fixLineBuffer, _updateBodyHash) the same buffers in the
 * same order, and leaves the same remainder for the next chunk (test/mail/fast-relaxed-body.test.ts
 * runs both on the same inputs and compares every call), save for a line longer than LONG_LINE_BYTES,
 * whose settled part it hashes early (the same hash; compared on random inputs).
 *
 * installFastRelaxedBody() puts it in place of mailauth's method (mailauth-patch.ts), and refuses at
 * start-up if that method or one of the helpers it calls is not there.
 */
import { replaceMailauthMethod } from './mailauth-patch.ts';

/** The part of mailauth's RelaxedHash that update() reads and calls. */
export interface RelaxedHashState {
  byteLength: number;
  canonicalizedLength: number;
  remainder: Buffer | false;
  _pushBodyHash(chunk: Buffer): void;
  _updateBodyHash(chunk: Buffer): void;
  fixLineBuffer(line: Buffer): Buffer;
}

type Update = (this: RelaxedHashState, chunk: Buffer | null, final?: boolean) => void;

const LF = 0x0a;
const CR = 0x0d;
const SPACE = 0x20;
const TAB = 0x09;
const TWO_SPACES = Buffer.from('  ');
const CRLF = Buffer.from('\r\n');

/**
 * A line longer than this (no line break yet) has its settled part canonicalized and hashed at once,
 * up to its last byte that is not white space (a final CR aside); only that white space, as one
 * space, and the CR wait for the next chunk. Without it each chunk was joined to the whole unfinished
 * line and rescanned: a 25 MiB body without a line break, under ten signatures, froze the milter
 * 5.8 s (mailauth's own method does the same, slower).
 * Lines up to this length are handed on exactly as mailauth would.
 */
export const LONG_LINE_BYTES = 64 * 1024;

/** relaxedUpdate settling lines longer than `longLineBytes`. */
export function relaxedUpdateSettling(longLineBytes: number): Update {
  return function update(this: RelaxedHashState, input: Buffer | null, final?: boolean): void {
    relaxedUpdateOnce.call(this, input, final);
    const rest = this.remainder;
    if (final || !rest || rest.length <= longLineBytes) return;
    // The remainder is one unfinished line. Only its last byte, if a CR, may start the line break;
    // before it, up to the last byte that is not white space, the line is settled: canonicalized as
    // mailauth canonicalizes a line (runs of white space to one space, a leading run included), it is
    // the line's beginning whatever follows. The white space after it is kept back as one space (a
    // run is one space mid-line, nothing at the end of a line), so a line of nothing but white space
    // waits as at most two bytes too.
    const cr = rest[rest.length - 1] === CR ? 1 : 0;
    let end = rest.length - cr - 1;
    while (end >= 0 && (rest[end] === SPACE || rest[end] === TAB)) end--;
    if (end >= 0) this._pushBodyHash(this.fixLineBuffer(rest.subarray(0, end + 1)));
    const kept = (end + 1 < rest.length - cr ? ' ' : '') + (cr ? '\r' : '');
    this.remainder = kept ? Buffer.from(kept, 'latin1') : false;
  };
}

export const relaxedUpdate: Update = relaxedUpdateSettling(LONG_LINE_BYTES);

function relaxedUpdateOnce(this: RelaxedHashState, input: Buffer | null, final?: boolean): void {
  this.byteLength += input?.length || 0;
  let chunk = input;
  if (this.remainder && this.remainder.length > 0) {
    chunk = chunk ? Buffer.concat([this.remainder, chunk]) : this.remainder;
    this.remainder = false;
  }

  // lineEndPos: the last line break seen; cursorPos: the first byte not yet handed on.
  let lineEndPos = -1;
  let cursorPos = 0;
  if (chunk && chunk.length > 0) {
    let tab = chunk.indexOf(TAB);
    let spaces = chunk.indexOf(TWO_SPACES);
    for (let pos = chunk.indexOf(LF); pos !== -1; pos = chunk.indexOf(LF, pos + 1)) {
      const lineStart = lineEndPos + 1;
      if (tab !== -1 && tab < lineStart) tab = chunk.indexOf(TAB, lineStart);
      if (spaces !== -1 && spaces < lineStart) spaces = chunk.indexOf(TWO_SPACES, lineStart);
      const needsFixing =
        (tab !== -1 && tab < pos) ||
        (spaces !== -1 && spaces < pos) ||
        pos === 0 ||
        chunk[pos - 1] !== CR ||
        (pos >= 2 && chunk[pos - 2] === SPACE);
      if (needsFixing) {
        // The lines before it that need nothing go on as they are, in one piece.
        if (lineEndPos >= 0 && lineEndPos >= cursorPos) {
          this._pushBodyHash(chunk.subarray(cursorPos, lineEndPos + 1));
        }
        this._pushBodyHash(this.fixLineBuffer(chunk.subarray(lineStart, pos + 1)));
        cursorPos = pos + 1;
      }
      lineEndPos = pos;
    }
  }

  if (chunk && cursorPos < chunk.length && cursorPos !== lineEndPos) {
    const complete = chunk.subarray(cursorPos, lineEndPos + 1);
    if (complete.length > 0) this._pushBodyHash(complete);
    cursorPos = lineEndPos + 1;
  }
  if (chunk && !final && cursorPos < chunk.length) this.remainder = chunk.subarray(cursorPos);

  if (final) {
    const last = chunk && cursorPos ? chunk.subarray(cursorPos) : chunk;
    if (chunk && last && last.length > 0) {
      // The last line has no line break: a tab or two spaces in it, or a space at its end, need fixing.
      const tail = chunk.subarray(lineEndPos + 1);
      const fix =
        tail.indexOf(TAB) !== -1 || tail.indexOf(TWO_SPACES) !== -1 || last[last.length - 1] === SPACE;
      this._pushBodyHash(fix ? this.fixLineBuffer(last) : last);
    }
    // The line break that ends a non-empty body.
    if (this.canonicalizedLength) this._updateBodyHash(CRLF);
  }
}

/** Replaces mailauth's RelaxedHash#update; returns the method it replaced. Idempotent. */
export function installFastRelaxedBody(): Update {
  return replaceMailauthMethod<Update>({
    module: 'mailauth/lib/dkim/body/relaxed.js',
    className: 'RelaxedHash',
    method: 'update',
    replacement: relaxedUpdate,
    calls: ['_pushBodyHash', '_updateBodyHash', 'fixLineBuffer'],
    by: 'src/mail/fast-relaxed-body.ts',
  });
}
