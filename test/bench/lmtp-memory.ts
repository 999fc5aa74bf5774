/**
 * lmtp-memory - `node test/bench/lmtp-memory.ts`. Starts the LMTP receiver (DeliveryService over
 * Postgres) in a child process on a scratch database, sends ten 25 MiB messages at once over ten LMTP
 * connections (XFORWARD IDENT, one inbox each), samples the receiver's RSS every 50 ms, and prints the
 * baseline, the peak, the growth (target: under 64 MiB, DESIGN decision 7 / STYLE 14) and the
 * throughput. Every stored copy is then checked against the SHA-256 of what was sent.
 *
 * BENCH_MESSAGES (10) and BENCH_MESSAGE_BYTES (26214400) change the load; BENCH_ADMIN_URL the server.
 * The receiver runs with the `lmtp` entry's V8 heap flags (src/heap-flags.ts), as in production;
 * BENCH_HEAP_FLAGS=0 runs it with V8's defaults. BENCH_GC=1 runs the receiver with --expose-gc and collects before every sample: the figures are then
 * live memory, without the garbage V8 lets pile up between collections.
 */
import { type ChildProcess, fork } from 'node:child_process';
import { createHash } from 'node:crypto';
import { newInboxId } from '../../src/core/ids.ts';
import { HEAP_FLAGS } from '../../src/heap-flags.ts';
import { LmtpClient } from '../lmtp/lmtp-client.ts';
import { asAdmin, recreateDatabase } from '../support/database.ts';

const MESSAGES = Number(process.env.BENCH_MESSAGES ?? 10);
const MESSAGE_BYTES = Number(process.env.BENCH_MESSAGE_BYTES ?? 25 * 1024 * 1024);
const PIECE_BYTES = 64 * 1024;
const SAMPLE_MS = 50;
const TARGET_GROWTH_MIB = 64;
const ADMIN_URL = process.env.BENCH_ADMIN_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const DB_NAME = 'inbox_lmtp_bench';
const MAIL_DOMAIN = 'inbox.test';
const MiB = 1024 * 1024;

const dbUrl = (() => {
  const url = new URL(ADMIN_URL);
  url.pathname = `/${DB_NAME}`;
  return url.toString();
})();

type Sample = { rss: number; heapUsed: number; arrayBuffers: number };
type ToChild = { kind: 'mark' } | { kind: 'report' };
type FromChild =
  | { kind: 'ready'; port: number }
  | { kind: 'report'; baseline: Sample; peak: Sample; samples: number };

// ---- the receiver (child process) -----------------------------------------------------------------

async function runReceiver(): Promise<void> {
  const { DeliveryService } = await import('../../src/core/delivery-service.ts');
  const { startLmtpServer } = await import('../../src/lmtp/server.ts');
  const { Database } = await import('../../src/storage/database.ts');
  const { PgMessageStore } = await import('../../src/storage/message-store.ts');
  const { systemClock } = await import('../../src/core/clock.ts');
  const database = new Database(dbUrl, MESSAGES + 2);
  const service = new DeliveryService(
    new PgMessageStore(database),
    systemClock,
    { mailDomain: MAIL_DOMAIN, authservId: `mx.${MAIL_DOMAIN}`, maxParallelStores: MESSAGES },
    () => {},
  );
  const server = await startLmtpServer({
    listen: { host: '127.0.0.1', port: 0 },
    handler: service,
    log: () => {},
    hostname: 'lmtp.bench.test',
    maxMessageBytes: MESSAGE_BYTES,
  });
  const sample = (): Sample => {
    const m = process.memoryUsage();
    return { rss: m.rss, heapUsed: m.heapUsed, arrayBuffers: m.arrayBuffers };
  };
  let baseline = sample();
  let peak = sample();
  let samples = 0;
  const gc = (globalThis as { gc?: () => void }).gc;
  const timer = setInterval(() => {
    if (process.env.BENCH_GC === '1') gc?.();
    const s = sample();
    samples++;
    peak = {
      rss: Math.max(peak.rss, s.rss),
      heapUsed: Math.max(peak.heapUsed, s.heapUsed),
      arrayBuffers: Math.max(peak.arrayBuffers, s.arrayBuffers),
    };
  }, SAMPLE_MS);
  process.on('message', async (message: ToChild) => {
    if (message.kind === 'mark') {
      baseline = sample();
      peak = sample();
      samples = 0;
    } else {
      clearInterval(timer);
      process.send?.({ kind: 'report', baseline, peak, samples } satisfies FromChild);
      await server.close();
      await database.close();
      process.exit(0);
    }
  });
  process.send?.({ kind: 'ready', port: server.port as number } satisfies FromChild);
}

// ---- the sender (this process) --------------------------------------------------------------------

/** A message of exactly `bytes` bytes, yielded in PIECE_BYTES pieces of 78-character CRLF lines. */
function* message(index: number, bytes: number, hash: ReturnType<typeof createHash>): Generator<Buffer> {
  const head = Buffer.from(
    `From: Bench <bench@example.org>\r\nSubject: bench message ${index}\r\nMessage-ID: <bench.${index}@example.org>\r\n\r\n`,
  );
  const line = `${`message ${index} `.padEnd(76, 'x')}\r\n`;
  const piece = Buffer.alloc(PIECE_BYTES, line);
  hash.update(head);
  yield head;
  for (let left = bytes - head.length; left > 0; left -= PIECE_BYTES) {
    // pieces restart mid-line at a line start: lines stay short, none starts with a dot
    const out = left > PIECE_BYTES ? piece : Buffer.from(piece.subarray(0, left));
    if (left <= PIECE_BYTES) out.write('\r\n', left - 2); // the message ends with CRLF
    hash.update(out);
    yield out;
  }
}

async function send(
  port: number,
  inboxId: string,
  index: number,
): Promise<{ reply: string; sha256: string }> {
  const hash = createHash('sha256');
  const client = await LmtpClient.connect({ port });
  await client.command('LHLO bench.test');
  await client.command(`XFORWARD IDENT=BENCH${process.pid}N${index}`);
  await client.command('MAIL FROM:<bench@example.org>');
  await client.command(`RCPT TO:<${inboxId}@${MAIL_DOMAIN}>`);
  const [reply] = await client.data(message(index, MESSAGE_BYTES, hash), 1);
  await client.quit();
  return { reply: reply ?? '', sha256: hash.digest('hex') };
}

const mib = (bytes: number) => (bytes / MiB).toFixed(1);

async function main(): Promise<void> {
  await recreateDatabase(DB_NAME, ADMIN_URL);
  const inboxes = Array.from({ length: MESSAGES + 1 }, () => newInboxId());
  await asAdmin(
    (client) =>
      client.query(
        `INSERT INTO inboxes (inbox_id, created_at, expires_at, quota_bytes)
       SELECT id, now(), now() + interval '1 hour', 104857600 FROM unnest($1::text[]) AS id`,
        [inboxes],
      ),
    dbUrl,
  );

  const child: ChildProcess = fork(new URL(import.meta.url).pathname, ['--receiver'], {
    stdio: 'inherit',
    execArgv: [
      ...process.execArgv,
      ...(process.env.BENCH_HEAP_FLAGS === '0' ? [] : (HEAP_FLAGS.lmtp ?? [])),
      ...(process.env.BENCH_GC === '1' ? ['--expose-gc'] : []),
    ],
  });
  const messages: FromChild[] = [];
  let wake: () => void = () => {};
  child.on('message', (m: FromChild) => {
    messages.push(m);
    wake();
  });
  const next = async <K extends FromChild['kind']>(kind: K): Promise<Extract<FromChild, { kind: K }>> => {
    for (;;) {
      const i = messages.findIndex((m) => m.kind === kind);
      if (i !== -1) return messages.splice(i, 1)[0] as Extract<FromChild, { kind: K }>;
      await new Promise<void>((resolve) => (wake = resolve));
    }
  };
  const { port } = await next('ready');

  // Warm-up: one small delivery loads every module and fills the pool's first connection.
  const warm = await LmtpClient.connect({ port });
  await warm.command('LHLO bench.test');
  await warm.command(`XFORWARD IDENT=BENCH${process.pid}WARM`);
  await warm.command('MAIL FROM:<bench@example.org>');
  await warm.command(`RCPT TO:<${inboxes[MESSAGES]}@${MAIL_DOMAIN}>`);
  await warm.data([Buffer.from('Subject: warm-up\r\n\r\nx\r\n')], 1);
  await warm.quit();
  await new Promise((resolve) => setTimeout(resolve, 500));
  child.send({ kind: 'mark' } satisfies ToChild);

  const started = performance.now();
  const results = await Promise.all(inboxes.slice(0, MESSAGES).map((id, i) => send(port, id, i)));
  const seconds = (performance.now() - started) / 1000;
  await new Promise((resolve) => setTimeout(resolve, 2 * SAMPLE_MS));
  child.send({ kind: 'report' } satisfies ToChild);
  const report = await next('report');
  await new Promise((resolve) => child.once('exit', resolve));

  const stored = await asAdmin(
    (client) =>
      client.query<{ inbox_id: string; size_bytes: number; sha256: Buffer }>(
        // The digest of the stored chunks, in order: what a download would serve.
        `SELECT m.inbox_id, m.size_bytes::int8::float8 AS size_bytes,
         sha256(string_agg(c.data, ''::bytea ORDER BY c.seq)) AS sha256
       FROM messages m JOIN message_chunks c USING (inbox_id, message_id)
       WHERE m.state = 'stored' GROUP BY m.inbox_id, m.message_id`,
      ),
    dbUrl,
  );
  const byInbox = new Map(stored.rows.map((r) => [r.inbox_id, r]));
  const intact = results.filter((r, i) => {
    const row = byInbox.get(inboxes[i] as string);
    return (
      r.reply.startsWith('250 ') &&
      row?.size_bytes === MESSAGE_BYTES &&
      row.sha256.toString('hex') === r.sha256
    );
  }).length;

  const growth = report.peak.rss - report.baseline.rss;
  const total = MESSAGES * MESSAGE_BYTES;
  process.stdout.write(
    [
      `LMTP receiver memory: ${MESSAGES} messages of ${mib(MESSAGE_BYTES)} MiB at once over ${MESSAGES} connections`,
      `  baseline RSS       ${mib(report.baseline.rss)} MiB (heap ${mib(report.baseline.heapUsed)}, buffers ${mib(report.baseline.arrayBuffers)})`,
      `  peak RSS           ${mib(report.peak.rss)} MiB (heap ${mib(report.peak.heapUsed)}, buffers ${mib(report.peak.arrayBuffers)})`,
      `  growth             ${mib(growth)} MiB (target < ${TARGET_GROWTH_MIB} MiB: ${growth < TARGET_GROWTH_MIB * MiB ? 'met' : 'MISSED'})`,
      `  samples            ${report.samples} every ${SAMPLE_MS} ms`,
      `  time               ${seconds.toFixed(2)} s`,
      `  throughput         ${(total / MiB / seconds).toFixed(1)} MiB/s (${(MESSAGES / seconds).toFixed(2)} messages/s)`,
      `  stored intact      ${intact}/${MESSAGES} (250 reply, size and SHA-256 match)`,
      '',
    ].join('\n'),
  );
  await asAdmin((client) => client.query(`DROP DATABASE IF EXISTS ${DB_NAME} WITH (FORCE)`));
  if (intact !== MESSAGES) process.exitCode = 1;
}

if (process.argv.includes('--receiver')) await runReceiver();
else await main();
