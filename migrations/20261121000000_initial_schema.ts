/**
 * The initial schema: inboxes and their credentials, messages (in flight, stored, deleted) with their
 * chunks, rejections, the per-inbox event sequence, opt-outs, idempotency records and rate buckets.
 */
import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  await knex.raw(`
    CREATE TABLE inboxes (
      inbox_id text PRIMARY KEY,
      created_at timestamptz NOT NULL,
      expires_at timestamptz NOT NULL,
      quota_bytes bigint NOT NULL CHECK (quota_bytes >= 0),
      sender_domains text[] NOT NULL DEFAULT '{}',
      cancelled_at timestamptz,
      rejection_count bigint NOT NULL DEFAULT 0,
      -- last position handed out in this inbox's event sequence (DESIGN decision 8)
      event_seq bigint NOT NULL DEFAULT 0,
      -- bumped by every write that changes what a poll lists (core/poll-cache.ts)
      version bigint NOT NULL DEFAULT 0
    );
    CREATE INDEX inboxes_expires_at ON inboxes (expires_at);

    -- Only SHA-256 of each credential is stored (DESIGN decision 10).
    CREATE TABLE credentials (
      credential_hash bytea PRIMARY KEY,
      inbox_id text NOT NULL REFERENCES inboxes ON DELETE CASCADE,
      role text NOT NULL CHECK (role IN ('owner', 'reader'))
    );
    CREATE INDEX credentials_inbox_id ON credentials (inbox_id);

    CREATE TABLE messages (
      inbox_id text NOT NULL REFERENCES inboxes ON DELETE CASCADE,
      message_id text NOT NULL,
      -- Postfix queue id: the milter's {i}, the LMTP receiver's XFORWARD IDENT (DESIGN decision 5)
      queue_id text,
      state text NOT NULL CHECK (state IN ('in_flight', 'stored', 'deleted')),
      size_bytes bigint NOT NULL CHECK (size_bytes >= 0),
      chunk_bytes integer,
      sha256 bytea,
      envelope_from text NOT NULL,
      from_name text,
      from_address text,
      subject text,
      internet_message_id text,
      authentication jsonb,
      reserved_at timestamptz NOT NULL,
      received_at timestamptz,
      position bigint,
      listed_at timestamptz,
      downloaded_at timestamptz,
      delete_after timestamptz,
      deleted_at timestamptz,
      deleted_reason text CHECK (deleted_reason IN ('downloaded', 'unclaimed', 'expired', 'lost', 'cancelled', 'released')),
      PRIMARY KEY (inbox_id, message_id),
      UNIQUE (inbox_id, queue_id)
    );
    CREATE UNIQUE INDEX messages_position ON messages (inbox_id, position) WHERE position IS NOT NULL;
    CREATE INDEX messages_in_flight ON messages (reserved_at) WHERE state = 'in_flight';

    CREATE TABLE message_chunks (
      inbox_id text NOT NULL,
      message_id text NOT NULL,
      seq integer NOT NULL,
      data bytea NOT NULL,
      PRIMARY KEY (inbox_id, message_id, seq),
      FOREIGN KEY (inbox_id, message_id) REFERENCES messages ON DELETE CASCADE
    );
    -- Chunks are stored uncompressed: pglz cost ~16 ms/MiB on insert and slowed reads 13x (DESIGN 7).
    ALTER TABLE message_chunks ALTER COLUMN data SET STORAGE EXTERNAL;

    CREATE TABLE rejections (
      inbox_id text NOT NULL REFERENCES inboxes ON DELETE CASCADE,
      position bigint NOT NULL,
      at timestamptz NOT NULL,
      envelope_from text NOT NULL,
      reason text NOT NULL,
      sender_domain text,
      size_bytes bigint NOT NULL CHECK (size_bytes >= 0),
      internet_message_id text,
      listed_at timestamptz,
      PRIMARY KEY (inbox_id, position)
    );
    CREATE INDEX rejections_message_id ON rejections (inbox_id, reason, internet_message_id)
      WHERE internet_message_id IS NOT NULL;
    CREATE INDEX rejections_listed_at ON rejections (listed_at);

    CREATE TABLE sender_optouts (
      domain text PRIMARY KEY,
      created_at timestamptz NOT NULL
    );

    -- Provision replays: looked up by HMAC of the key, the response sealed under the key itself.
    CREATE TABLE provision_idempotency (
      key_hash bytea PRIMARY KEY,
      request_hash bytea NOT NULL,
      sealed_response bytea NOT NULL,
      created_at timestamptz NOT NULL
    );
    CREATE INDEX provision_idempotency_created_at ON provision_idempotency (created_at);

    CREATE TABLE extend_idempotency (
      inbox_id text NOT NULL REFERENCES inboxes ON DELETE CASCADE,
      key_hash bytea NOT NULL,
      response jsonb NOT NULL,
      created_at timestamptz NOT NULL,
      PRIMARY KEY (inbox_id, key_hash)
    );

    -- GCRA rate buckets (DESIGN decision 11). UNLOGGED: a bucket is worth no WAL flush per request,
    -- and losing them in a crash only forgives some requests.
    -- Every request rewrites its bucket's row: half-empty pages keep those updates HOT (no index
    -- change, pruned in place).
    CREATE UNLOGGED TABLE rate_buckets (
      inbox_id text NOT NULL,
      bucket text NOT NULL CHECK (bucket IN ('poll', 'download')),
      tat timestamptz NOT NULL,
      PRIMARY KEY (inbox_id, bucket)
    ) WITH (fillfactor = 50);
  `);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw(`
    DROP TABLE rate_buckets, extend_idempotency, provision_idempotency, sender_optouts, rejections,
      message_chunks, messages, credentials, inboxes;
  `);
}
