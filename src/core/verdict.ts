/**
 * verdict - one admission decision type for every mail protocol (STYLE 3).
 *
 * The core decides; each adapter translates: the policy daemon into `action=`, the milter into a reply
 * packet, the LMTP receiver into one reply per recipient. Recipients are default-deny: nothing is
 * accepted that no rule accepted.
 */
export type Verdict =
  | { kind: 'accept' }
  /** A 4xx: the sender keeps the message and retries. */
  | { kind: 'defer'; code: number; dsn: string; text: string }
  /** A 5xx: the sender gives up and tells its user. */
  | { kind: 'reject'; code: number; dsn: string; text: string };

export type Refusal = Exclude<Verdict, { kind: 'accept' }>;

export const ACCEPT: Verdict = Object.freeze({ kind: 'accept' });

/** `451 4.3.0 text`: the reply line of a refusal, as a peer sees it. */
export const replyLine = (v: Refusal): string => `${v.code} ${v.dsn} ${v.text}`;
