/**
 * policy-load - a load generator speaking the Postfix policy protocol, as smtpd does: N persistent
 * connections, each sending one RCPT-stage request at a time and waiting for its `action=` reply.
 *
 * Run by policy-bench.ts as its own process (so it does not share an event loop with the target):
 * `node test/bench/policy-load.ts < config.json` prints one JSON LoadResult line. Requests started
 * during the warm-up are not counted; latency is from the write of a request to the end of its reply.
 *
 * Every request is a new transaction of a different triplet (client /24, sender, recipient), the shape
 * of first-time mail at a greylisting server: postgrey inserts one database record per request. The
 * attribute set is what Postfix 3.7 sends at RCPT (MAIL-FACTS A.2), TLS on, no SASL.
 */
import net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { seededRandom } from '../support/seeded-random.ts';

export interface LoadConfig {
  host: string;
  port: number;
  connections: number;
  warmupSeconds: number;
  seconds: number;
  /** Recipients to cycle through; default `box<N>@svc.test` for N below 10,000. */
  recipients?: string[];
}

export interface LoadResult {
  requests: number;
  seconds: number;
  rps: number;
  p50ms: number;
  p99ms: number;
  /** Connections lost or replies that were not `action=...`. */
  errors: number;
  /** Replies by their first word: DUNNO, DEFER_IF_PERMIT, 555, ... */
  actions: Record<string, number>;
}

function requestMaker(connection: number, recipients: string[] | undefined): () => string {
  const next = seededRandom(0x9e3779b9 ^ connection);
  const pick = (n: number) => Math.floor(next() * n);
  let sequence = 0;
  return () => {
    sequence++;
    const net24 = `${10 + pick(200)}.${pick(256)}.${pick(256)}`;
    const host = `mail${pick(100)}.sender${pick(5000)}.example`;
    const recipient = recipients?.length
      ? (recipients[pick(recipients.length)] as string)
      : `box${pick(10000)}@svc.test`;
    return [
      'request=smtpd_access_policy',
      'protocol_state=RCPT',
      'protocol_name=ESMTP',
      `helo_name=${host}`,
      'queue_id=',
      `sender=user${pick(100000)}@${host.slice(host.indexOf('.') + 1)}`,
      `recipient=${recipient}`,
      'recipient_count=0',
      `client_address=${net24}.${1 + pick(254)}`,
      `client_name=${host}`,
      `reverse_client_name=${host}`,
      `instance=${(4000 + connection).toString(16)}.6b016c6e.${sequence.toString(16)}.0`,
      'sasl_method=',
      'sasl_username=',
      'sasl_sender=',
      `size=${1000 + pick(100000)}`,
      'ccert_subject=',
      'ccert_issuer=',
      'ccert_fingerprint=',
      'ccert_pubkey_fingerprint=',
      'encryption_protocol=TLSv1.3',
      'encryption_cipher=TLS_AES_256_GCM_SHA384',
      'encryption_keysize=256',
      'etrn_domain=',
      'stress=',
      'server_address=192.0.2.25',
      'server_port=25',
      `client_port=${1024 + pick(64000)}`,
      'policy_context=',
      'compatibility_level=3.6',
      'mail_version=3.7.11',
      '',
      '',
    ].join('\n');
  };
}

export async function runLoad(config: LoadConfig): Promise<LoadResult> {
  const started = performance.now();
  const measureFrom = started + config.warmupSeconds * 1000;
  const stopAt = measureFrom + config.seconds * 1000;
  const latencies: number[] = [];
  const actions: Record<string, number> = {};
  let errors = 0;

  const worker = async (index: number) => {
    const makeRequest = requestMaker(index, config.recipients);
    while (performance.now() < stopAt) {
      const lost = await session(config, makeRequest, stopAt, (reply, sentAt, doneAt) => {
        if (sentAt < measureFrom || doneAt > stopAt) return;
        latencies.push(doneAt - sentAt);
        const action = /^action=(\S+)/.exec(reply)?.[1];
        if (action) actions[action] = (actions[action] ?? 0) + 1;
        else errors++;
      });
      if (lost) {
        errors++;
        await sleep(10);
      }
    }
  };
  await Promise.all(Array.from({ length: config.connections }, (_, i) => worker(i)));

  latencies.sort((a, b) => a - b);
  const quantile = (q: number) =>
    latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))] ?? 0;
  return {
    requests: latencies.length,
    seconds: config.seconds,
    rps: latencies.length / config.seconds,
    p50ms: quantile(0.5),
    p99ms: quantile(0.99),
    errors,
    actions,
  };
}

/** One connection until stopAt; resolves true if the server closed it first. */
function session(
  config: LoadConfig,
  makeRequest: () => string,
  stopAt: number,
  onReply: (reply: string, sentAt: number, doneAt: number) => void,
): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect(config.port, config.host);
    socket.setNoDelay(true);
    socket.setEncoding('latin1');
    let buffered = '';
    let sentAt = 0;
    let done = false;
    const send = () => {
      if (performance.now() >= stopAt) {
        done = true;
        socket.end();
        return;
      }
      sentAt = performance.now();
      socket.write(makeRequest());
    };
    socket.on('connect', send);
    socket.on('data', (text: string) => {
      buffered += text;
      const end = buffered.indexOf('\n\n');
      if (end === -1) return;
      onReply(buffered.slice(0, end), sentAt, performance.now());
      buffered = buffered.slice(end + 2);
      send();
    });
    socket.on('error', () => {});
    socket.on('close', () => resolve(!done));
  });
}

if (import.meta.main) {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  const result = await runLoad(JSON.parse(Buffer.concat(chunks).toString('utf8')) as LoadConfig);
  process.stdout.write(`${JSON.stringify(result)}\n`);
}
