/**
 * reply - translates the core's end-of-message result into milter reply packets (STYLE 3: one
 * translator per protocol). Pure.
 *
 * accept: the header deletes (`m` with an empty value), then the inserts (`i`), then `c`.
 *   Deletes go in descending index order: Postfix renumbers the later instances of a name after a delete,
 *   so deleting 1 then 3 would miss the third (MAIL-FACTS C.6, lab-tested). Deletes go before inserts so
 *   an index never hits a header we just inserted. Insert values get the one leading space Postfix no
 *   longer adds once SMFIP_HDR_LEADSPC is negotiated (milter8.c MILTER8_HDR_SPACE), and CRLF folds become
 *   LF: Postfix stores a CRLF fold as a bare CR plus CRLF (MAIL-FACTS C.6, lab-tested).
 * defer/reject: one `y` with the reply line; Postfix passes it to the sender byte for byte.
 *
 * Throws on a result Postfix would refuse or mangle (reply class and enhanced status class differ, a
 * CR or LF in the text, a bad header name or index); the caller answers `t` instead.
 */
import { replyLine, type Verdict } from '../core/verdict.ts';
import { encodeChangeHeader, encodeContinue, encodeInsertHeader, encodeReplyCode } from './codec.ts';
import type { HeaderEdits } from './handler.ts';

/** RFC 5322 section 3.6.8: printable US-ASCII except colon. */
const FIELD_NAME = /^[\x21-\x39\x3b-\x7e]+$/;
/** RFC 5321 section 4.2, RFC 3463 section 2: `4xx 4.x.x` or `5xx 5.x.x`, same class. */
const REPLY_CODE = { defer: /^4\d\d$/, reject: /^5\d\d$/ } as const;
const DSN = /^([45])\.\d{1,3}\.\d{1,3}$/;

export function endOfMessageReply(result: { verdict: Verdict; edits?: HeaderEdits | undefined }): Buffer {
  const { verdict } = result;
  if (verdict.kind === 'accept') return Buffer.concat([...headerEditPackets(result.edits), encodeContinue()]);
  const code = String(verdict.code);
  if (!REPLY_CODE[verdict.kind].test(code) || DSN.exec(verdict.dsn)?.[1] !== code[0]) {
    throw new Error(`malformed ${verdict.kind} verdict: ${code} ${verdict.dsn}`);
  }
  if (/[\r\n]/.test(verdict.text)) throw new Error(`${verdict.kind} verdict text contains CR or LF`);
  return encodeReplyCode(replyLine(verdict));
}

export function headerEditPackets(edits: HeaderEdits | undefined): Buffer[] {
  if (!edits) return [];
  const deletes = new Map<string, { name: string; index: number }>();
  for (const edit of edits.delete) {
    checkName(edit.name);
    if (!Number.isInteger(edit.index) || edit.index < 1) throw new Error(`bad delete index ${edit.index}`);
    // Header names compare case-insensitively; deleting one instance twice would hit its successor.
    const key = `${edit.index} ${edit.name.toLowerCase()}`;
    if (!deletes.has(key)) deletes.set(key, edit);
  }
  const ordered = [...deletes.values()].sort((a, b) => b.index - a.index);
  const packets = ordered.map((edit) => encodeChangeHeader(edit.index, edit.name, ''));
  for (const edit of edits.insert) {
    checkName(edit.name);
    if (!Number.isInteger(edit.index) || edit.index < 0) throw new Error(`bad insert index ${edit.index}`);
    packets.push(encodeInsertHeader(edit.index, edit.name, ` ${edit.value.replaceAll('\r\n', '\n')}`));
  }
  return packets;
}

function checkName(name: string): void {
  if (!FIELD_NAME.test(name)) throw new Error(`bad header name ${JSON.stringify(name)}`);
}
