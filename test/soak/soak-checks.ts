/**
 * soak-checks - what the crash soak requires once the queues are empty: every message accepted by the
 * sending MTA stored exactly once in each of its inboxes, its bytes the ones sent, nothing bounced or
 * refused for good, each inbox's held bytes the sum of its messages, and no reservation left behind
 * by a milter that was killed.
 */
import type pg from 'pg';
import type { Agent } from './agent.ts';
import { bareMessageId, type SoakMessage, soakMessage } from './soak-mail.ts';

export interface SoakRun {
  run: string;
  seed: number;
  inboxIds: string[];
  addresses: string[];
  /** The messages the sending MTA took (250 at end of data), with its queue id. */
  accepted: { n: number; queueId: string }[];
  /** `queueId address` of each recipient the sending MTA bounced because our MX said the quota is used up. */
  refusedForQuota: Set<string>;
}

export interface CheckResult {
  name: string;
  ok: boolean;
  detail: string;
}

const check = (name: string, ok: boolean, detail: string): CheckResult => ({ name, ok, detail });
const sample = (items: string[]) => items.slice(0, 5).join(', ') + (items.length > 5 ? ', ...' : '');
/** Passes when `failures` is empty (its detail is then `passed`), else names the first few. */
const none = (name: string, failures: string[], passed: string): CheckResult =>
  check(name, failures.length === 0, failures.length ? `${failures.length}: ${sample(failures)}` : passed);

export async function checkStorage(client: pg.Client, soak: SoakRun): Promise<CheckResult[]> {
  const inboxCount = soak.inboxIds.length;
  const message = (n: number): SoakMessage => soakMessage(soak.run, soak.seed, n, inboxCount);
  const { rows } = await client.query<{ inbox_id: string; message_id: string; mid: string; size: number }>(
    `SELECT inbox_id, message_id, internet_message_id AS mid, size_bytes::int AS size
       FROM messages WHERE state = 'stored'`,
  );
  const stored = new Map<string, { inboxId: string; messageId: string; size: number }[]>();
  for (const row of rows) {
    const key = `${row.inbox_id} ${bareMessageId(row.mid)}`;
    stored.set(key, [
      ...(stored.get(key) ?? []),
      { inboxId: row.inbox_id, messageId: row.message_id, size: row.size },
    ]);
  }
  const missing: string[] = [];
  const twice: string[] = [];
  const storedAndRefused: string[] = [];
  let refused = 0;
  const wrongBytes: string[] = [];
  const expected = new Set<string>();
  for (const { n, queueId } of soak.accepted) {
    const sent = message(n);
    for (const index of sent.inboxes) {
      const key = `${soak.inboxIds[index]} ${sent.messageId}`;
      const copies = stored.get(key) ?? [];
      if (soak.refusedForQuota.has(`${queueId} ${soak.addresses[index]}`)) {
        refused++;
        if (copies.length > 0) storedAndRefused.push(`${n} in inbox ${index}`);
        continue;
      }
      expected.add(key);
      if (copies.length === 0) missing.push(`${n} in inbox ${index}`);
      if (copies.length > 1) twice.push(`${n} in inbox ${index} (${copies.length} copies)`);
      for (const copy of copies) {
        const { rows: chunks } = await client.query<{ data: Buffer }>(
          'SELECT data FROM message_chunks WHERE inbox_id = $1 AND message_id = $2 ORDER BY seq',
          [copy.inboxId, copy.messageId],
        );
        const raw = Buffer.concat(chunks.map((c) => c.data));
        const tail = raw.subarray(Math.max(0, raw.length - sent.bytes.length));
        if (raw.length !== copy.size || !tail.equals(sent.bytes)) {
          wrongBytes.push(`${n} in inbox ${index} (${raw.length} bytes stored, size ${copy.size})`);
        }
      }
    }
  }
  const unexpected = [...stored.keys()].filter((key) => !expected.has(key));
  return [
    none(
      'every accepted message stored',
      missing,
      `${expected.size} expected, all there; ${refused} refused for quota`,
    ),
    none('nothing both stored and refused', storedAndRefused, 'none'),
    none('none stored twice', twice, `${rows.length} rows`),
    none('nothing stored that was not sent', unexpected, 'none'),
    none('stored bytes end with the bytes sent', wrongBytes, 'all'),
  ];
}

export async function checkAccounts(client: pg.Client, quotaRefusals: boolean): Promise<CheckResult[]> {
  const { rows: held } = await client.query<{ inbox_id: string; held: number; sum: number }>(
    `SELECT i.inbox_id, i.held_bytes::int8 AS held,
            coalesce(sum(m.size_bytes) FILTER (WHERE m.state <> 'deleted'), 0)::int8 AS sum
       FROM inboxes i LEFT JOIN messages m USING (inbox_id) GROUP BY i.inbox_id, i.held_bytes`,
  );
  const off = held
    .filter((r) => Number(r.held) !== Number(r.sum))
    .map((r) => `${r.inbox_id}: ${r.held} != ${r.sum}`);
  const { rows: over } = await client.query<{ inbox_id: string; held: number; quota: number }>(
    'SELECT inbox_id, held_bytes::int8 AS held, quota_bytes::int8 AS quota FROM inboxes WHERE held_bytes > quota_bytes',
  );
  const { rows: reasons } = await client.query<{ reason: string; n: number }>(
    'SELECT reason, count(*)::int AS n FROM rejections GROUP BY reason',
  );
  const allowed = (reason: string) => quotaRefusals && reason === 'quota';
  return [
    none('held bytes are the sum of the messages', off, `${held.length} inboxes`),
    none(
      'no inbox over its quota',
      over.map((r) => `${r.inbox_id}: ${r.held} > ${r.quota}`),
      `${held.length} inboxes`,
    ),
    none(
      quotaRefusals ? 'no rejection but for quota' : 'no rejection recorded',
      reasons.filter((r) => !allowed(r.reason)).map((r) => `${r.n} ${r.reason}`),
      reasons.map((r) => `${r.n} ${r.reason}`).join(', ') || 'none',
    ),
  ];
}

/** In-flight rows: those a milter owns (the sweep must release them) and those it could not name. */
export async function inFlight(client: pg.Client): Promise<{ owned: number; unowned: number }> {
  const { rows } = await client.query<{ owned: number; unowned: number }>(
    `SELECT count(*) FILTER (WHERE reserved_by IS NOT NULL)::int AS owned,
            count(*) FILTER (WHERE reserved_by IS NULL)::int AS unowned
       FROM messages WHERE state = 'in_flight'`,
  );
  return rows[0] ?? { owned: 0, unowned: 0 };
}

const QUOTA_REPLY = /said: 555 5\.7\.1 .*: mailbox quota exceeded/;

/** The recipients the sending MTA bounced on our quota refusal, as `queueId address`. */
export function quotaRefusals(senderLog: string): Set<string> {
  const refused = new Set<string>();
  for (const line of senderLog.split('\n')) {
    const bounce = /(\w+): to=<([^>]+)>.*status=bounced /.exec(line);
    if (bounce && QUOTA_REPLY.test(line)) refused.add(`${bounce[1]} ${bounce[2]}`);
  }
  return refused;
}

/**
 * What the two Postfix logs say: nothing bounced, expired or refused with a 5xx, but for our quota
 * refusal when the soak's inboxes are small (`quotaRefusals`).
 */
export function checkLogs(senderLog: string, mxLog: string, quotaRefusals: boolean): CheckResult[] {
  const lines = (log: string, pattern: RegExp) =>
    log.split('\n').filter((line) => pattern.test(line) && !(quotaRefusals && QUOTA_REPLY.test(line)));
  const but = quotaRefusals ? ' but for quota' : '';
  return [
    none(`the sender bounced nothing${but}`, lines(senderLog, /status=(bounced|expired)/), 'none'),
    none(`no 5xx reply to the sender${but}`, lines(senderLog, /said: 5\d\d /), 'none'),
    none('our Postfix bounced nothing', lines(mxLog, /status=(bounced|expired)/), 'none'),
  ];
}

/**
 * Each daemon's log: how many error and warning lines, the most frequent messages among them, and the
 * first error line whole (cut at 400 characters): what to look at when one is unexpected.
 */
export function summarizeLog(text: string): {
  errors: number;
  warnings: number;
  top: string[];
  firstError?: string;
} {
  const counts = new Map<string, number>();
  let errors = 0;
  let warnings = 0;
  let firstError: string | undefined;
  for (const line of text.split('\n')) {
    const level = /"level":"(error|warn)"/.exec(line)?.[1];
    if (!level) continue;
    if (level === 'error') {
      errors++;
      firstError ??= line.slice(0, 400);
    } else warnings++;
    const msg = `${level}: ${/"msg":"((?:[^"\\]|\\.)*)"/.exec(line)?.[1] ?? line.slice(0, 120)}`;
    counts.set(msg, (counts.get(msg) ?? 0) + 1);
  }
  const top = [...counts]
    .sort((a, b) => b[1] - a[1])
    .slice(0, 6)
    .map(([msg, n]) => `${n} x ${msg}`);
  return { errors, warnings, top, ...(firstError ? { firstError } : {}) };
}

/** What the agents saw through the API: every stored message listed once, downloaded, byte for byte. */
export async function checkAgents(client: pg.Client, agents: Agent[]): Promise<CheckResult[]> {
  const { rows } = await client.query<{ inbox_id: string; message_id: string }>(
    `SELECT inbox_id, message_id FROM messages WHERE state = 'stored'`,
  );
  const byInbox = new Map(agents.map((agent) => [agent.inboxId, agent]));
  const notListed = rows.filter((row) => !byInbox.get(row.inbox_id)?.listed.has(row.message_id));
  const notDownloaded = rows.filter((row) => !byInbox.get(row.inbox_id)?.downloaded.has(row.message_id));
  const twice: string[] = [];
  for (const agent of agents) {
    for (const [id, urls] of agent.listed) if (urls.size > 1) twice.push(`${id} by ${urls.size} cursors`);
  }
  const wrong = agents.flatMap((agent) => agent.wrongBytes);
  const unexpected = agents.flatMap((agent) => agent.unexpected);
  const sum = (of: (agent: Agent) => number) => agents.reduce((total, agent) => total + of(agent), 0);
  return [
    none(
      'polling listed every stored message',
      notListed.map((row) => row.message_id),
      `${rows.length} listed`,
    ),
    none('no message listed from two cursor positions', twice, 'none'),
    none(
      'every stored message downloaded through the API',
      notDownloaded.map((row) => row.message_id),
      'all',
    ),
    none('downloads end with the bytes sent', wrong, 'all'),
    check(
      'no unexpected API answer',
      unexpected.length === 0,
      `${unexpected.length ? sample(unexpected) : 'none'} (${sum((a) => a.serverErrors)} 5xx and ${sum((a) => a.connectionErrors)} failed connections, repeated)`,
    ),
  ];
}
