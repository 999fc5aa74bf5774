/**
 * chunk-storage - what storing message bytes costs Postgres, per MiB, with the chunk column uncompressed
 * (STORAGE EXTERNAL, before migration 20261126000000) and lz4-compressed (EXTENDED + lz4, after), for
 * three kinds of content:
 *   - smtp-source: the body mail-bench's `smtp-source` sends (lines of "X"), compressible without end;
 *   - html: generated HTML paragraphs of random words, like the notification mail the service receives;
 *   - base64: a base64 attachment of random bytes (76-character lines), which lz4 cannot shrink.
 * Each message (1 MiB) goes in through copyChunks, the receiver's path, in its own transaction with a
 * commit. Figures: the Postgres backend's CPU per MiB (from /proc; the WAL writer's and checkpointer's
 * later work is not in it), WAL bytes and stored bytes per MiB.
 *
 *   node test/bench/chunk-storage.ts   (BENCH_MESSAGES: messages per content and storage, default 60)
 */
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { copyChunks } from '../../src/storage/copy-chunks.ts';
import { CHUNK_BYTES } from '../../src/storage/message-store.ts';
import { recreateDatabase } from '../support/database.ts';
import { sampleCpu } from './cpu-usage.ts';

const ADMIN_URL = process.env.BENCH_ADMIN_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const DB_NAME = 'inbox_chunk_bench';
const MESSAGES = Number(process.env.BENCH_MESSAGES ?? 60);
const MiB = 1024 * 1024;
const STORAGES = {
  external: 'SET STORAGE EXTERNAL, ALTER COLUMN data SET COMPRESSION default',
  lz4: 'SET STORAGE EXTENDED, ALTER COLUMN data SET COMPRESSION lz4',
};

const WORDS = `account confirm password reset your the a to of and link expires minutes security team
  sign in verify address request we received if you did not ignore this email support billing invoice
  report daily summary order shipped tracking number click here button unsubscribe preferences`.split(/\s+/);

function lines(make: (i: number) => string): Buffer {
  const parts: string[] = [];
  let size = 0;
  for (let i = 0; size < MiB; i++) {
    const line = `${make(i)}\r\n`;
    parts.push(line);
    size += line.length;
  }
  return Buffer.from(parts.join('')).subarray(0, MiB);
}

const CONTENTS: Record<string, () => Buffer> = {
  'smtp-source': () => lines((i) => `${i % 10}`.padEnd(78, 'X')),
  html: () =>
    lines((i) => {
      const words = Array.from({ length: 12 }, () => WORDS[Math.floor(Math.random() * WORDS.length)]);
      return i % 6 === 0 ? `<p style="margin:0 0 12px 0;font-family:Arial">` : words.join(' ');
    }),
  base64: () => {
    const text = randomBytes(MiB).toString('base64');
    return lines((i) => text.slice(i * 76, i * 76 + 76));
  },
};

/** The CPU milliseconds this connection's Postgres backend has used so far (cpu-usage.ts). */
async function backendCpuMs(client: pg.Client): Promise<number> {
  const { rows } = await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
  const { processes } = await sampleCpu({ backend: rows[0]?.pid as number });
  return (processes.backend ?? 0) * 1000;
}

async function scalar(client: pg.Client, sql: string): Promise<number> {
  const { rows } = await client.query<{ v: string }>(sql);
  return Number(rows[0]?.v);
}

async function main(): Promise<void> {
  const url = await recreateDatabase(DB_NAME, ADMIN_URL);
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  const out: string[] = [];
  try {
    await client.query(
      `INSERT INTO inboxes (inbox_id, created_at, expires_at, quota_bytes, sender_domains)
       VALUES ('bench', now(), now() + interval '1 day', 1e12, '{}')`,
    );
    let n = 0;
    for (const [content, make] of Object.entries(CONTENTS)) {
      const body = make();
      for (const [storage, alter] of Object.entries(STORAGES)) {
        await client.query(`ALTER TABLE message_chunks ALTER COLUMN data ${alter}`);
        const size0 = await scalar(client, `SELECT pg_total_relation_size('message_chunks') AS v`);
        const wal0 = await scalar(client, `SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn AS v`);
        const cpu0 = await backendCpuMs(client);
        const started = performance.now();
        for (let i = 0; i < MESSAGES; i++) {
          const id = `m${n++}`;
          await client.query('BEGIN');
          await client.query(`SELECT begin_delivery('bench', $1, $1, '', now())`, [id]);
          await copyChunks(
            client as unknown as pg.PoolClient,
            'bench',
            id,
            (async function* () {
              for (let at = 0; at < body.length; at += 64 * 1024) yield body.subarray(at, at + 64 * 1024);
            })(),
            CHUNK_BYTES,
          );
          await client.query('COMMIT');
        }
        const ms = performance.now() - started;
        const cpu = (await backendCpuMs(client)) - cpu0;
        const wal = (await scalar(client, `SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn AS v`)) - wal0;
        const size = (await scalar(client, `SELECT pg_total_relation_size('message_chunks') AS v`)) - size0;
        const per = (x: number) => (x / MESSAGES).toFixed(2);
        out.push(
          `| ${content} | ${storage} | ${per(cpu)} | ${per(ms)} | ${per(wal / MiB)} | ${per(size / MiB)} |`,
        );
      }
    }
  } finally {
    await client.end();
  }
  process.stdout.write(
    [
      `${MESSAGES} messages of 1 MiB per row, each through copyChunks in its own transaction`,
      '| content | storage | backend CPU ms/MiB | wall ms/MiB | WAL MiB/MiB | stored MiB/MiB |',
      '|---|---|---|---|---|---|',
      ...out,
      '',
    ].join('\n'),
  );
}

main().catch((error: unknown) => {
  process.stderr.write(`${error instanceof Error ? error.stack : String(error)}\n`);
  process.exit(1);
});
