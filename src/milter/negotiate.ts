/**
 * negotiate - our answer to SMFIC_OPTNEG: protocol version, the edits we may make, the events we skip
 * replying to. Pure.
 *
 * Bits from Postfix src/milter/milter8.c (SMFIF_*, SMFIP_*), as listed in MAIL-FACTS C.4. Postfix refuses
 * a reply whose version exceeds its own or whose actions it did not offer; it honours an NR_* bit by not
 * waiting for a reply to that event. We claim only protocol bits the MTA offered.
 *
 * What we ask for, and why:
 * - actions SMFIF_ADDHDRS|SMFIF_CHGHDRS: insert our Authentication-Results, delete forged ones.
 *   Not SMFIF_SETSYMLIST: sending any macro list makes Postfix replace *every* stage's default list
 *   with an empty one (milter8_connect, milter_macros_alloc(MILTER_MACROS_ALLOC_EMPTY)). Our
 *   main.cf asks for `i` with DATA and no other macro (MAIL-FACTS C.7; postfix/README.md).
 * - SMFIP_HDR_LEADSPC: header values arrive with the space after the colon, so a rebuilt message keeps
 *   DKIM simple canonicalization intact (MAIL-FACTS C.6); required, we refuse an MTA without it.
 * - NR_CONN, NR_HELO, NR_MAIL, NR_RCPT, NR_UNKN, NR_HDR, NR_BODY: events we only record or
 *   consume; no reply, no round trip (every RCPT-time decision is the policy daemon's, DESIGN table).
 *   Each reply costs a round trip with Postfix's smtpd or cleanup: NR_MAIL and NR_RCPT take two of the
 *   five from a one-recipient message; NR_BODY the one per 64 KiB body chunk (16 per MiB: at 1 MiB the
 *   milter spent 28% of its CPU writing them; without them 2.4-2.5 instead of 2.7-2.8 ms per message,
 *   81-82 instead of 77-81 messages/s, mail-bench ours alone). Flow control stays: the connection
 *   reads no further packet while one is being handled (connection.ts), so Postfix's writes wait on
 *   the socket. A chunk that fails marks the message failed; its verdict is `t` at EOM, the earliest
 *   the sender can be told anyway (smtpd answers the DATA only after the final dot).
 * - We reply to DATA, although we only record it, so that every message does not wait 40 ms. Postfix
 *   writes the no-reply events up to DATA as one small segment, then the headers and EOH as another;
 *   Nagle's algorithm on Postfix's socket holds the second until the first is acknowledged, and with
 *   no reply to carry it the milter's kernel sends that ACK only when its delayed-ACK timer fires.
 *   tcpdump showed 42.5 of a one-session message's 48.5 ms spent so; our continue to DATA carries the
 *   ACK, and the message takes about 6 ms (mail-bench with BENCH_SESSIONS=1: 20 -> 199 messages/s).
 * - We reply to EOH (a handler that cannot begin fails the message there, and Postfix stops sending
 *   its content). EOM always needs a reply.
 * - Not NOCONNECT/NOHELO/NOMAIL/NORCPT/NOHDRS/NOEOH/NOBODY: the core needs all of it. Not SKIP: we never
 *   skip body chunks. Not RCPT_REJ: rejected recipients are none of our business.
 */
import { SMFIC } from './codec.ts';

export const MILTER_VERSION = 6;

export const SMFIF_ADDHDRS = 0x01;
export const SMFIF_CHGHDRS = 0x10;
export const SMFIF_SETSYMLIST = 0x100;

export const SMFIP_NR_HDR = 1 << 7;
export const SMFIP_NR_CONN = 1 << 12;
export const SMFIP_NR_HELO = 1 << 13;
export const SMFIP_NR_MAIL = 1 << 14;
export const SMFIP_NR_RCPT = 1 << 15;
export const SMFIP_NR_DATA = 1 << 16;
export const SMFIP_NR_UNKN = 1 << 17;
export const SMFIP_NR_EOH = 1 << 18;
export const SMFIP_NR_BODY = 1 << 19;
export const SMFIP_HDR_LEADSPC = 1 << 20;

export const REQUIRED_ACTIONS = SMFIF_ADDHDRS | SMFIF_CHGHDRS;
export const WANTED_PROTOCOL =
  SMFIP_HDR_LEADSPC |
  SMFIP_NR_CONN |
  SMFIP_NR_HELO |
  SMFIP_NR_MAIL |
  SMFIP_NR_RCPT |
  SMFIP_NR_UNKN |
  SMFIP_NR_HDR |
  SMFIP_NR_BODY;

export interface Negotiation {
  version: number;
  actions: number;
  protocol: number;
}

export type NegotiationResult = { ok: true; reply: Negotiation } | { ok: false; reason: string };

export function negotiate(offer: Negotiation): NegotiationResult {
  if (offer.version < MILTER_VERSION) {
    return { ok: false, reason: `MTA offers milter protocol ${offer.version}, we need ${MILTER_VERSION}` };
  }
  if ((offer.actions & REQUIRED_ACTIONS) !== REQUIRED_ACTIONS) {
    return { ok: false, reason: `MTA actions 0x${offer.actions.toString(16)} lack ADDHDRS|CHGHDRS` };
  }
  if ((offer.protocol & SMFIP_HDR_LEADSPC) === 0) {
    return { ok: false, reason: `MTA protocol 0x${offer.protocol.toString(16)} lacks HDR_LEADSPC` };
  }
  return {
    ok: true,
    reply: {
      version: MILTER_VERSION,
      actions: REQUIRED_ACTIONS,
      protocol: (WANTED_PROTOCOL & offer.protocol) >>> 0,
    },
  };
}

/** The no-reply bit of each event that can take one; events absent here never get a reply (E always does). */
const NO_REPLY_BIT: Record<string, number> = {
  [SMFIC.CONNECT]: SMFIP_NR_CONN,
  [SMFIC.HELO]: SMFIP_NR_HELO,
  [SMFIC.MAIL]: SMFIP_NR_MAIL,
  [SMFIC.RCPT]: SMFIP_NR_RCPT,
  [SMFIC.DATA]: SMFIP_NR_DATA,
  [SMFIC.UNKNOWN]: SMFIP_NR_UNKN,
  [SMFIC.HEADER]: SMFIP_NR_HDR,
  [SMFIC.EOH]: SMFIP_NR_EOH,
  [SMFIC.BODY]: SMFIP_NR_BODY,
};

/** Whether the MTA waits for a reply to this command under the negotiated protocol bits. */
export function expectsReply(command: string, protocol: number): boolean {
  if (command === SMFIC.BODYEOB) return true;
  const bit = NO_REPLY_BIT[command];
  return bit !== undefined && (protocol & bit) === 0;
}
