/**
 * metrics - the Prometheus metrics of one process (prom-client, a Registry of its own), served on
 * METRICS_PORT by ops-server.ts. The daemons call the small hooks below as things happen; nothing is
 * derived from log lines. A hook never throws and never waits.
 *
 * Label values come from closed sets (verdict kinds, reply names, route templates, job names), so the
 * number of series stays bounded whatever the peers send. Names:
 *
 *   inbox_mail_verdicts_total{daemon,stage,verdict,reason}  every admission and delivery decision
 *   inbox_policy_decision_seconds{stage}                    policy request to verdict
 *   inbox_milter_decision_seconds                           end of message to verdict (authentication
 *                                                           included)
 *   inbox_lmtp_store_seconds, inbox_lmtp_message_bytes      one LMTP delivery (DATA to the last reply)
 *   inbox_http_requests_total{method,route,status}, inbox_http_request_seconds{method,route}
 *   inbox_job_runs_total{job,outcome}, inbox_job_rows_total{job,what},
 *   inbox_job_freed_bytes_total{job}, inbox_job_seconds{job}
 *   inbox_db_pool_connections{state=total|idle}, inbox_db_pool_waiting, inbox_db_pool_max
 *   inbox_orphan_reservations_released_total                 a dead milter's reservations a live one freed
 *   process_* and nodejs_* (prom-client's defaults: CPU, memory, event loop lag, handles)
 */
import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from 'prom-client';

export type VerdictLabel = 'accept' | 'defer' | 'reject' | 'error';

export interface PoolUse {
  total: number;
  idle: number;
  waiting: number;
  max: number;
}

/** Job counts that are not rows deleted or marked (see the jobs' log lines). */
const NOT_ROWS = new Set(['bytes', 'checked', 'waiting']);

const SECONDS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];
const MESSAGE_BYTES = [1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 33554432];

export class Metrics {
  readonly registry = new Registry();
  readonly #verdicts: Counter<'daemon' | 'stage' | 'verdict' | 'reason'>;
  readonly #policySeconds: Histogram<'stage'>;
  readonly #milterSeconds: Histogram;
  readonly #lmtpSeconds: Histogram;
  readonly #lmtpBytes: Histogram;
  readonly #httpRequests: Counter<'method' | 'route' | 'status'>;
  readonly #httpSeconds: Histogram<'method' | 'route'>;
  readonly #jobRuns: Counter<'job' | 'outcome'>;
  readonly #jobRows: Counter<'job' | 'what'>;
  readonly #jobBytes: Counter<'job'>;
  readonly #orphans: Counter;
  readonly #jobSeconds: Histogram<'job'>;

  constructor() {
    const registers = [this.registry];
    collectDefaultMetrics({ register: this.registry });
    this.#verdicts = new Counter({
      name: 'inbox_mail_verdicts_total',
      help: 'Mail decisions: policy (connect, rcpt), milter (end_of_message) and LMTP (per recipient)',
      labelNames: ['daemon', 'stage', 'verdict', 'reason'],
      registers,
    });
    this.#policySeconds = new Histogram({
      name: 'inbox_policy_decision_seconds',
      help: 'Policy daemon: time from a request to its verdict',
      labelNames: ['stage'],
      buckets: SECONDS,
      registers,
    });
    this.#milterSeconds = new Histogram({
      name: 'inbox_milter_decision_seconds',
      help: 'Milter: time from end of message to the verdict (authentication, admission, reservation)',
      buckets: SECONDS,
      registers,
    });
    this.#lmtpSeconds = new Histogram({
      name: 'inbox_lmtp_store_seconds',
      help: 'LMTP receiver: time from DATA to the replies, the message stored in every inbox',
      buckets: SECONDS,
      registers,
    });
    this.#lmtpBytes = new Histogram({
      name: 'inbox_lmtp_message_bytes',
      help: 'LMTP receiver: size of each message received (the sum is the bytes received)',
      buckets: MESSAGE_BYTES,
      registers,
    });
    this.#httpRequests = new Counter({
      name: 'inbox_http_requests_total',
      help: 'API requests by route template and status',
      labelNames: ['method', 'route', 'status'],
      registers,
    });
    this.#httpSeconds = new Histogram({
      name: 'inbox_http_request_seconds',
      help: 'API: time from a request to the end of its response',
      labelNames: ['method', 'route'],
      buckets: SECONDS,
      registers,
    });
    this.#jobRuns = new Counter({
      name: 'inbox_job_runs_total',
      help: 'Lifecycle job runs: complete, incomplete (more to do), skipped (locked elsewhere), failed',
      labelNames: ['job', 'outcome'],
      registers,
    });
    this.#jobRows = new Counter({
      name: 'inbox_job_rows_total',
      help: 'Rows a lifecycle job deleted or marked, by kind (the counts of its log line)',
      labelNames: ['job', 'what'],
      registers,
    });
    this.#jobBytes = new Counter({
      name: 'inbox_job_freed_bytes_total',
      help: 'Message content a lifecycle job freed',
      labelNames: ['job'],
      registers,
    });
    this.#orphans = new Counter({
      name: 'inbox_orphan_reservations_released_total',
      help: 'Reservations of dead milters that never answered them, released by this milter (mail/orphan-sweep.ts)',
      registers,
    });
    this.#jobSeconds = new Histogram({
      name: 'inbox_job_seconds',
      help: 'Duration of one lifecycle job run',
      labelNames: ['job'],
      buckets: SECONDS,
      registers,
    });
  }

  /** Reservations of dead milters this one released (mail/orphan-sweep.ts). */
  orphansReleased(count: number): void {
    if (count > 0) this.#orphans.inc(count);
  }

  /** Reads the pool's use at each scrape. */
  watchPool(use: () => PoolUse | undefined): void {
    const registers = [this.registry];
    const read = (pick: (u: PoolUse) => number) =>
      function (this: Gauge) {
        const current = use();
        if (current) this.set(pick(current));
      };
    new Gauge({
      name: 'inbox_db_pool_connections',
      help: 'Database pool: open connections (total) and those idle',
      labelNames: ['state'],
      registers,
      collect(this: Gauge<'state'>) {
        const current = use();
        if (!current) return;
        this.set({ state: 'total' }, current.total);
        this.set({ state: 'idle' }, current.idle);
      },
    });
    new Gauge({
      name: 'inbox_db_pool_waiting',
      help: 'Database pool: queries waiting for a connection',
      registers,
      collect: read((u) => u.waiting),
    });
    new Gauge({
      name: 'inbox_db_pool_max',
      help: 'Database pool: its size',
      registers,
      collect: read((u) => u.max),
    });
  }

  verdict(daemon: string, stage: string, verdict: VerdictLabel, reason: string): void {
    this.#verdicts.inc({ daemon, stage, verdict, reason });
  }

  policyDecision(stage: string, seconds: number): void {
    this.#policySeconds.observe({ stage }, seconds);
  }

  milterDecision(seconds: number): void {
    this.#milterSeconds.observe(seconds);
  }

  /** One LMTP delivery: `outcomes` counts its recipients per outcome (stored, duplicate, ...). */
  lmtpDelivery(report: {
    seconds: number;
    bytes: number;
    outcomes: Record<string, { verdict: VerdictLabel; count: number }>;
  }): void {
    this.#lmtpSeconds.observe(report.seconds);
    this.#lmtpBytes.observe(report.bytes);
    for (const [reason, { verdict, count }] of Object.entries(report.outcomes)) {
      if (count > 0) this.#verdicts.inc({ daemon: 'lmtp', stage: 'delivery', verdict, reason }, count);
    }
  }

  httpRequest(method: string, route: string, status: number, seconds: number): void {
    this.#httpRequests.inc({ method, route, status: String(status) });
    this.#httpSeconds.observe({ method, route }, seconds);
  }

  jobRun(report: {
    job: string;
    ran: boolean;
    complete: boolean;
    error?: string;
    counts: Record<string, number>;
    durationMs: number;
  }): void {
    const { job } = report;
    const outcome = report.error
      ? 'failed'
      : !report.ran
        ? 'skipped'
        : report.complete
          ? 'complete'
          : 'incomplete';
    this.#jobRuns.inc({ job, outcome });
    if (!report.ran) return;
    this.#jobSeconds.observe({ job }, report.durationMs / 1000);
    for (const [what, count] of Object.entries(report.counts)) {
      if (what === 'bytes') this.#jobBytes.inc({ job }, count);
      else if (!NOT_ROWS.has(what) && count > 0) this.#jobRows.inc({ job, what }, count);
    }
  }
}
