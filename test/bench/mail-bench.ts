/**
 * mail-bench - messages stored per second through the real stack, against the same Postfix delivering
 * to a null LMTP sink (`smtp-sink -L`) as the yardstick (issue 3's targets: at least 0.5 of the
 * yardstick for 10 KiB messages, 0.6 for 1 MiB).
 *
 * Both runs use one private Postfix configuration rendered from postfix/ with the test DNS (dnsmasq).
 * The yardstick run removes the policy service and the milter and points virtual_transport at
 * smtp-sink; ours runs the policy daemon, milter and LMTP receiver as three processes
 * (`node src/main.ts policy|milter|lmtp`, the production shape) on a scratch database.
 * A third run, "hooks only", keeps our Postfix configuration but points the policy service and the milter
 * at null-daemons.ts (they decide nothing) and delivers to the sink: the part of the gap that is
 * Postfix's own side of the hooks (the rounds' line also gives ours/hooks, ours against that ceiling).
 * Load:
 * `smtp-source -s 20` (20 parallel sessions) from 127.0.0.1, one recipient per message. Each run first
 * takes a warm-up round (BENCH_WARMUP, half the count), not counted; then time runs from the first
 * connection to the last message stored (ours: counted in Postgres; the sink's: Postfix's `status=sent`
 * lines in its log). Each case runs BENCH_ROUNDS rounds (4) of the three configurations in turn, in an
 * order that alternates (ORDER below); the table shows medians, the ratios being the medians of each
 * round's own ratio. A second table gives the CPU time per message of the measured part (cpu-usage.ts,
 * from /proc): the machine's, in every configuration, and each of our three daemons' (all threads, so
 * V8's collector helpers count). Each run's line also gives the machine's context switches per message
 * (/proc/stat ctxt).
 *
 *   node test/bench/mail-bench.ts   (BENCH_SMALL_COUNT, BENCH_LARGE_COUNT, BENCH_SESSIONS, BENCH_ROUNDS,
 *                                    BENCH_WARMUP, BENCH_UNCOMPRESSED, BENCH_HOPS, BENCH_PG_SOCKET,
 *                                    BENCH_BY_COMMAND, BENCH_SPLIT)
 *
 * A count of 0 skips that case. BENCH_BY_COMMAND=1 adds each run's CPU per message by command name
 * (postgres, smtpd, cleanup, lmtp, node, ...): where the machine's time goes beyond our three daemons.
 *
 * smtp-source's body (lines of "X") compresses a hundredfold under the chunk column's lz4;
 * BENCH_UNCOMPRESSED=1 stores the chunks uncompressed, for the cost of bytes that do not compress.
 *
 * BENCH_SPLIT=1 adds two runs per round that each keep half of ours: our policy daemon and milter
 * (with their Postgres work: lookups, the reservation) delivering to the sink, and the null hooks
 * delivering to our LMTP receiver (storage without the milter's reservation). Which half costs what.
 *
 * BENCH_HOPS: how Postfix reaches the daemons. `tcp` (the default, as `make run` and the container stack
 * wire them): loopback TCP; `unix`: the policy daemon, milter and LMTP receiver on unix sockets, and so
 * are the null hooks and the sink, so that the yardstick's LMTP hop is carried as ours is. Here `unix`
 * changed neither the rate nor our daemons' CPU per message beyond the noise. BENCH_PG_SOCKET=1 puts
 * our PostgreSQL connections on its socket directory (/var/run/postgresql) instead of loopback TCP.
 *
 * ORDER: odd rounds run sink, hooks, ours; even rounds the reverse, so that no configuration always
 * runs after the others. The runs share the machine's state: here Postfix's queue files live on an ext4
 * without a journal, whose inode allocator skips every inode deleted in the last minutes
 * (`recently_deleted`), and that cost anywhere between 0.06 and 0.9 ms of CPU per message from one run
 * to the next (perf, system-wide), whichever configuration ran. An even number of rounds gives each
 * order the same weight. The queue is made under TMPDIR (TMPDIR=/dev/shm: on tmpfs, where no such cost
 * exists); the summary's first line names its file system.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { chmod, mkdtemp, open, readFile, rm, statfs } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { type Config, loadConfig } from '../../src/config/config.ts';
import { buildContainer, TOKENS } from '../../src/container.ts';
import type { InboxService } from '../../src/core/inbox-service.ts';
import { listenOn } from '../../src/net/listen.ts';
import { PostfixInstance } from '../../src/postfix/instance.ts';
import { renderPostfix } from '../../src/postfix/render.ts';
import type { Database } from '../../src/storage/database.ts';
import { recreateDatabase } from '../support/database.ts';
import { testZone } from '../support/dns-zone.ts';
import { startDnsmasq } from '../support/dnsmasq.ts';
import { freePorts } from '../support/sender-postfix.ts';
import { perCommandMs, perMessageMs, sampleCpu, sampleProcesses, switchesPerMessage } from './cpu-usage.ts';
import { nullMilterServer, nullPolicyServer } from './null-daemons.ts';
import { waitListening } from './wait-listening.ts';

const ADMIN_URL = process.env.TEST_DATABASE_ADMIN_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const DB_NAME = 'inbox_mail_bench';
/** `unix` or `tcp`: see the header. */
const HOPS = process.env.BENCH_HOPS ?? 'tcp';
if (HOPS !== 'unix' && HOPS !== 'tcp') throw new Error(`BENCH_HOPS must be unix or tcp (got "${HOPS}")`);
const SOCKETS = HOPS === 'unix';
const PG_SOCKET = process.env.BENCH_PG_SOCKET === '1';
/** BENCH_UNCOMPRESSED=1: chunks stored uncompressed, as before migration 20261126000000 (lz4). */
const UNCOMPRESSED = process.env.BENCH_UNCOMPRESSED === '1';
const SESSIONS = Number(process.env.BENCH_SESSIONS ?? 20);
/** Rounds per case; the table shows medians (each ratio is the median of the rounds' own ratios). */
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 4);
/** The warm-up round's size, as a fraction of the measured round's. */
const WARMUP = Number(process.env.BENCH_WARMUP ?? 0.5);
/** BENCH_BY_COMMAND=1: also print each run's CPU ms/message by command name (postgres, smtpd, ...). */
const BY_COMMAND = process.env.BENCH_BY_COMMAND === '1';
/** BENCH_SPLIT=1: two more runs per round, each with half of ours (see the header). */
const SPLIT = process.env.BENCH_SPLIT === '1';
/** Our daemons: the entry of src/main.ts each runs, its name in the CPU figures, where it listens. */
const DAEMONS = [
  { entry: 'policy', name: 'policy', listen: 'POLICY_PORT' },
  { entry: 'milter', name: 'milter', listen: 'MILTER_PORT' },
  { entry: 'lmtp', name: 'receiver', listen: 'LMTP_PORT' },
] as const;
const CASES = [
  { name: '10 KiB', bytes: 10 * 1024, count: Number(process.env.BENCH_SMALL_COUNT ?? 2000), target: 0.5 },
  { name: '1 MiB', bytes: 1024 * 1024, count: Number(process.env.BENCH_LARGE_COUNT ?? 300), target: 0.6 },
].filter((c) => c.count > 0);
const NODE = process.execPath;
const run = (cmd: string, args: string[]) =>
  new Promise<string>((resolve, reject) =>
    execFile(cmd, args, { maxBuffer: 1 << 24 }, (error, stdout, stderr) =>
      error ? reject(new Error(`${cmd} ${args.join(' ')}: ${stderr || error.message}`)) : resolve(stdout),
    ),
  );

async function main(): Promise<void> {
  const dbUrl = new URL(await recreateDatabase(DB_NAME, ADMIN_URL));
  if (UNCOMPRESSED) {
    const client = new pg.Client({ connectionString: dbUrl.toString() });
    await client.connect();
    await client.query('ALTER TABLE message_chunks ALTER COLUMN data SET STORAGE EXTERNAL');
    await client.end();
  }

  const socketDir = await mkdtemp(join(tmpdir(), 'mail-bench-sockets-'));
  await chmod(socketDir, 0o755);
  const dns = await startDnsmasq({ records: testZone().records });
  const [policyPort, milterPort, lmtpPort, sinkPort, smtpPort, nullPolicyPort, nullMilterPort] =
    await freePorts(7);
  const env: Record<string, string> = {
    ENVIRONMENT: 'dev',
    DATABASE_URL: PG_SOCKET ? `postgres://postgres@/${DB_NAME}?host=/var/run/postgresql` : dbUrl.toString(),
    SECRET_KEY: 'mail-bench-secret-key-0123456789abcdef',
    MAIL_DOMAIN: 'svc.test',
    AUTHSERV_ID: 'mx.svc.test',
    DNS_SERVERS: dns.address,
    QUOTA_BYTES: String(100 * 1024 ** 3),
    POLICY_PORT: SOCKETS ? join(socketDir, 'policy.sock') : String(policyPort),
    MILTER_PORT: SOCKETS ? join(socketDir, 'milter.sock') : String(milterPort),
    LMTP_PORT: SOCKETS ? join(socketDir, 'lmtp.sock') : String(lmtpPort),
    SMTP_PORT: String(smtpPort),
  };
  const config = loadConfig(env) as Config & { secretKey: string };
  const container = buildContainer(config, { log: () => {} });
  const inboxes = container.resolve<InboxService>(TOKENS.InboxService);
  const db = container.resolve<Database>(TOKENS.Database);

  const children: ChildProcess[] = [];
  const baseDir = await mkdtemp(join(tmpdir(), 'mail-bench-'));
  await chmod(baseDir, 0o755); // the postfix user must reach the queue below it
  const queueFs = fileSystemName((await statfs(baseDir)).type);
  const results: string[] = [];
  const cpuResults: string[] = [];
  const splitResults: string[] = [];
  const roundRatios: string[] = [];
  const closers: (() => void)[] = [];
  const instances: PostfixInstance[] = [];
  try {
    // Each daemon's log goes to a file, whose end is printed should the benchmark fail.
    for (const { entry } of DAEMONS) {
      const log = await open(join(baseDir, `${entry}.log`), 'w');
      children.push(
        spawn(NODE, ['src/main.ts', entry], {
          env: { ...process.env, ...env },
          stdio: ['ignore', log.fd, log.fd],
        }),
      );
      await log.close();
    }
    await Promise.all(
      DAEMONS.map(({ entry, listen }, i) =>
        waitListening(
          entry,
          SOCKETS ? String(env[listen]) : Number(env[listen]),
          children[i] as ChildProcess,
        ),
      ),
    );
    const daemonPids = Object.fromEntries(DAEMONS.map(({ name }, i) => [name, children[i]?.pid as number]));
    const asUser = process.getuid?.() === 0 ? ['-u', 'postfix'] : [];
    // The sink, the null hooks: on the same kind of hop as ours.
    const hop = (name: string, port: number) => (SOCKETS ? join(socketDir, `${name}.sock`) : port);
    const sinkAt = hop('sink', sinkPort as number);
    const sinkEndpoint = typeof sinkAt === 'string' ? `unix:${sinkAt}` : `inet:127.0.0.1:${sinkAt}`;
    const sink = spawn('smtp-sink', [...asUser, '-L', sinkEndpoint, '256'], { stdio: 'ignore' });
    children.push(sink);
    await waitListening('smtp-sink', sinkAt, sink);

    const nullPolicy = nullPolicyServer();
    const nullMilter = nullMilterServer();
    const nullPolicyAt = hop('null-policy', nullPolicyPort as number);
    const nullMilterAt = hop('null-milter', nullMilterPort as number);
    const asListen = (at: string | number) =>
      typeof at === 'string' ? { path: at } : { host: '127.0.0.1', port: at };
    await listenOn(nullPolicy, asListen(nullPolicyAt), () => nullPolicy.address());
    await listenOn(nullMilter, asListen(nullMilterAt), () => nullMilter.address());
    closers.push(
      () => nullPolicy.close(),
      () => nullMilter.close(),
    );
    const hooksConfig = loadConfig({
      ...env,
      POLICY_PORT: String(nullPolicyAt),
      MILTER_PORT: String(nullMilterAt),
    }) as Config;

    const instance = (name: string, overrides: Record<string, string>, rendered: Config = config) =>
      new PostfixInstance({
        baseDir: join(baseDir, name),
        render: (dirs) => renderPostfix(rendered, dirs, overrides),
        smtp: { host: '127.0.0.1', port: smtpPort as number },
      });
    const toSink = { virtual_transport: `lmtp:${sinkEndpoint}` };
    instances.push(
      instance('sink', {
        ...toSink,
        smtpd_client_restrictions: '',
        smtpd_recipient_restrictions: 'reject_unauth_destination',
        smtpd_milters: '',
      }),
      instance('hooks', toSink, hooksConfig),
      instance('ours', {}),
    );
    const [yardstick, hooks, ours] = instances as [PostfixInstance, PostfixInstance, PostfixInstance];
    // BENCH_SPLIT: our policy daemon and milter delivering to the sink; the null hooks delivering to ours.
    const ourHooks = instance('our-hooks', toSink);
    const ourReceiver = instance('our-receiver', {}, hooksConfig);
    if (SPLIT) instances.push(ourHooks, ourReceiver);

    for (const c of CASES) {
      // The same inbox for every round of a case; rounds interleave the three configurations so that
      // the machine's drift between runs (the sink ranged 460-700/s here) reaches all three alike.
      const inbox = (await inboxes.provision([])).body;
      // Polled every 50 ms while a run drains: only the messages stored since the last poll are read,
      // by their event position through messages_position (only a stored message has a position, given
      // in commit order, and the bench deletes nothing, so no state condition is needed). A count of the
      // whole inbox cost 10 ms per poll by the fourth round, charged to ours.
      const seen = { count: 0, position: 0 };
      const storedCount = async () => {
        const [row] = await db.rows<{ n: number; last: number | null }>(
          'bench-count',
          `SELECT count(*)::int AS n, max(position) AS last FROM messages
           WHERE inbox_id = $1 AND position > $2`,
          [inbox.inbox_id, seen.position],
        );
        seen.count += row?.n ?? 0;
        seen.position = Number(row?.last ?? seen.position);
        return seen.count;
      };
      const rounds: {
        sink: Measured;
        hooks: Measured;
        ours: Measured;
        split?: { ourHooks: Measured; ourReceiver: Measured };
      }[] = [];
      for (let round = 1; round <= ROUNDS; round++) {
        const label = (name: string) => `${name} (round ${round})`;
        const toInbox = { ...c, to: inbox.address };
        const runs: Record<Run, () => Promise<Measured>> = {
          sink: () =>
            measure(yardstick, c, async () => countSent(yardstick), label('sink'), dns.resolvConfPath),
          hooks: () => measure(hooks, c, async () => countSent(hooks), label('hooks'), dns.resolvConfPath),
          ourHooks: () =>
            measure(
              ourHooks,
              toInbox,
              async () => countSent(ourHooks),
              label('our hooks, sink'),
              dns.resolvConfPath,
              daemonPids,
            ),
          ourReceiver: () =>
            measure(
              ourReceiver,
              toInbox,
              storedCount,
              label('null hooks, our receiver'),
              dns.resolvConfPath,
              daemonPids,
            ),
          ours: () => measure(ours, toInbox, storedCount, label('ours'), dns.resolvConfPath, daemonPids),
        };
        // Odd rounds run the sink first and ours last, even rounds the reverse (ORDER in the header).
        const order: Run[] = [
          'sink',
          'hooks',
          ...(SPLIT ? (['ourHooks', 'ourReceiver'] as const) : []),
          'ours',
        ];
        if (round % 2 === 0) order.reverse();
        const measured = new Map<Run, Measured>();
        for (const name of order) measured.set(name, await runs[name]());
        const pick = (name: Run) => measured.get(name) as Measured;
        rounds.push({
          sink: pick('sink'),
          hooks: pick('hooks'),
          ours: pick('ours'),
          split: SPLIT ? { ourHooks: pick('ourHooks'), ourReceiver: pick('ourReceiver') } : undefined,
        });
      }
      const sinkRate = median(rounds.map((r) => r.sink.rate));
      const hooksRatio = median(rounds.map((r) => r.hooks.rate / r.sink.rate));
      const ratio = median(rounds.map((r) => r.ours.rate / r.sink.rate));
      results.push(
        `| ${c.name} | ${c.count} | ${sinkRate.toFixed(0)} | ${median(rounds.map((r) => r.hooks.rate)).toFixed(0)} (${hooksRatio.toFixed(2)}) | ${median(rounds.map((r) => r.ours.rate)).toFixed(0)} | ${ratio.toFixed(2)} | ${c.target} | ${ratio >= c.target ? 'yes' : 'no'} |`,
      );
      roundRatios.push(
        `${c.name}: ours/sink ${rounds.map((r) => (r.ours.rate / r.sink.rate).toFixed(2)).join(', ')}; hooks/sink ${rounds.map((r) => (r.hooks.rate / r.sink.rate).toFixed(2)).join(', ')}; ours/hooks ${rounds.map((r) => (r.ours.rate / r.hooks.rate).toFixed(2)).join(', ')}`,
      );
      const ms = (pick: (r: (typeof rounds)[number]) => number) => median(rounds.map(pick)).toFixed(2);
      cpuResults.push(
        `| ${c.name} | ${ms((r) => r.sink.cpu.machine ?? 0)} | ${ms((r) => r.hooks.cpu.machine ?? 0)} | ${ms((r) => r.ours.cpu.machine ?? 0)} | ${ms((r) => r.ours.cpu.policy ?? 0)} | ${ms((r) => r.ours.cpu.milter ?? 0)} | ${ms((r) => r.ours.cpu.receiver ?? 0)} |`,
      );
      if (SPLIT) {
        const half = (pick: (r: (typeof rounds)[number]) => Measured | undefined) =>
          `${median(rounds.map((r) => pick(r)?.rate ?? 0)).toFixed(0)} (${median(rounds.map((r) => (pick(r)?.rate ?? 0) / r.sink.rate)).toFixed(2)}), machine ${ms((r) => pick(r)?.cpu.machine ?? 0)} ms`;
        splitResults.push(
          `| ${c.name} | ${half((r) => r.split?.ourHooks)} | ${half((r) => r.split?.ourReceiver)} | ${half((r) => r.ours)} |`,
        );
      }
    }
  } catch (error) {
    for (const { entry } of DAEMONS) {
      const text = await readFile(join(baseDir, `${entry}.log`), 'utf8').catch(() => '');
      process.stderr.write(
        `--- the end of the ${entry} daemon's log\n${text.split('\n').slice(-20).join('\n')}\n`,
      );
    }
    throw error;
  } finally {
    for (const postfix of instances) await postfix.stop().catch(() => undefined);
    for (const child of children) child.kill('SIGTERM');
    for (const close of closers) close();
    await db.close();
    await dns.stop();
    await rm(baseDir, { recursive: true, force: true });
    await rm(socketDir, { recursive: true, force: true });
  }
  process.stdout.write(
    [
      `\n${SESSIONS} smtp-source sessions, one recipient per message; messages/s from first connection to last stored; median of ${ROUNDS} rounds; hops to the daemons and the sink: ${SOCKETS ? 'unix sockets' : 'loopback TCP'}; PostgreSQL: ${PG_SOCKET ? 'unix socket' : 'loopback TCP'}; Postfix's queue: ${queueFs} (${baseDir}, TMPDIR moves it)`,
      'hooks only: the same Postfix configuration with a policy server and milter that decide nothing (null-daemons.ts), delivering to the sink',
      '| size | messages | sink msg/s | hooks only msg/s (ratio) | ours msg/s | ratio | target | met |',
      '|---|---|---|---|---|---|---|---|',
      ...results,
      '',
      "The rounds' own ratios (odd rounds ran sink, hooks, ours; even rounds the reverse):",
      ...roundRatios,
      '',
      'CPU ms per message (median of the rounds; machine: all processes, all cores; the daemons: all their threads)',
      '| size | sink: machine | hooks only: machine | ours: machine | policy daemon | milter | receiver |',
      '|---|---|---|---|---|---|---|',
      ...cpuResults,
      '',
      ...(SPLIT
        ? [
            'Ours in halves (BENCH_SPLIT): msg/s (ratio to the sink), machine CPU ms per message; medians of the rounds',
            '| size | our policy daemon and milter, sink | null hooks, our receiver | ours (both) |',
            '|---|---|---|---|',
            ...splitResults,
            '',
          ]
        : []),
    ].join('\n'),
  );
}

/** Postfix's `status=sent` lines so far, reading only what the log gained since the last call. */
const sentSoFar = new Map<string, { offset: number; partial: string; sent: number }>();
async function countSent(postfix: PostfixInstance): Promise<number> {
  const file = postfix.dirs.maillogFile;
  const state = sentSoFar.get(file) ?? { offset: 0, partial: '', sent: 0 };
  sentSoFar.set(file, state);
  const handle = await open(file, 'r').catch(() => undefined);
  if (!handle) return state.sent;
  try {
    const { size } = await handle.stat();
    if (size === state.offset) return state.sent;
    const bytes = Buffer.alloc(size - state.offset);
    await handle.read(bytes, 0, bytes.length, state.offset);
    state.offset = size;
    const lines = (state.partial + bytes.toString('utf8')).split('\n');
    state.partial = lines.pop() ?? '';
    state.sent += lines.filter((line) => line.includes('status=sent')).length;
    return state.sent;
  } finally {
    await handle.close();
  }
}

/** The configurations a round measures (ourHooks and ourReceiver only with BENCH_SPLIT). */
type Run = 'sink' | 'hooks' | 'ourHooks' | 'ourReceiver' | 'ours';

interface Measured {
  rate: number;
  /** CPU ms per message: `machine`, and each process of `pids`. */
  cpu: Record<string, number>;
}

async function measure(
  postfix: PostfixInstance,
  c: { name: string; bytes: number; count: number; to?: string },
  delivered: () => Promise<number>,
  label: string,
  resolvConf: string,
  pids: Record<string, number> = {},
): Promise<Measured> {
  await postfix.stop();
  await rm(postfix.dirs.maillogFile, { force: true });
  sentSoFar.delete(postfix.dirs.maillogFile);
  await postfix.prepare();
  await postfix.start({ resolvConf });
  const to = c.to ?? 'sink@svc.test';
  const send = async (count: number) => {
    const before = await delivered();
    const started = performance.now();
    await run('smtp-source', [
      '-s',
      String(SESSIONS),
      '-m',
      String(count),
      '-l',
      String(c.bytes),
      '-f',
      'bench@allowed.test',
      '-t',
      to,
      '-M',
      'mail.sender.test',
      `127.0.0.1:${postfix.smtp.port}`,
    ]);
    for (;;) {
      const done = (await delivered()) - before;
      if (done >= count) break;
      if (performance.now() - started > 600_000)
        throw new Error(`${label}: only ${done} of ${count} delivered`);
      await sleep(50);
    }
    return (performance.now() - started) / 1000;
  };
  // Steady state: a first round, not counted, warms every process of the path (Postfix's, and the JIT of
  // ours; cold, the first 2,000 10 KiB messages went about 20% slower).
  await send(Math.max(SESSIONS, Math.round(c.count * WARMUP)));
  const before = await sampleCpu(pids);
  const table = BY_COMMAND ? await sampleProcesses() : undefined;
  const seconds = await send(c.count);
  const after = await sampleCpu(pids);
  const cpu = perMessageMs(before, after, c.count);
  const switches = switchesPerMessage(before, after, c.count);
  if (table) {
    const byCommand = Object.entries(perCommandMs(table, await sampleProcesses(), c.count))
      .filter(([, ms]) => ms >= 0.05)
      .sort((a, b) => b[1] - a[1])
      .map(([command, ms]) => `${command} ${ms.toFixed(2)}`);
    process.stdout.write(`${label} ${c.name} by command: ${byCommand.join(', ')}\n`);
  }
  const rate = c.count / seconds;
  const cpuText = Object.entries(cpu)
    .map(([name, ms]) => `${name} ${ms.toFixed(2)}`)
    .join(', ');
  process.stdout.write(
    `${label} ${c.name}: ${c.count} messages in ${seconds.toFixed(1)} s = ${rate.toFixed(0)}/s; CPU ms/message: ${cpuText}; context switches/message ${switches.toFixed(0)}\n`,
  );
  await postfix.stop();
  return { rate, cpu };
}

/**
 * The queue's file system by statfs(2) magic number: it matters here, as an ext4 without a journal makes
 * every configuration pay for skipping recently deleted inodes (ORDER above).
 */
function fileSystemName(magic: number): string {
  const names = new Map([
    [0xef53, 'ext2/3/4'],
    [0x01021994, 'tmpfs'],
    [0x58465342, 'xfs'],
    [0x9123683e, 'btrfs'],
    [0x794c7630, 'overlayfs'],
  ]);
  return names.get(magic) ?? `file system 0x${magic.toString(16)}`;
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2
    ? (sorted[mid] as number)
    : ((sorted[mid - 1] as number) + (sorted[mid] as number)) / 2;
}

main().catch((error: unknown) => {
  process.stderr.write(`${error instanceof Error ? error.stack : String(error)}\n`);
  process.exit(1);
});
