/**
 * deadline - bounds how long a daemon waits for a decision. A stalled database (a lock held by a stuck
 * transaction, a host gone without a reset) must end in a temporary failure the MTA can act on, not in
 * a connection held open for as long as the stall lasts.
 */

export class DeadlineExceeded extends Error {
  override name = 'DeadlineExceeded';
}

/** Settles as `work` does, or rejects with DeadlineExceeded after `ms`; `work` itself runs on. */
export function withDeadline<T>(work: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const overdue = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new DeadlineExceeded(`${what} took longer than ${ms} ms`)), ms);
  });
  return Promise.race([work, overdue]).finally(() => clearTimeout(timer));
}
