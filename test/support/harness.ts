/**
 * harness - the API on a real socket, over a fresh clone of the migrated database, with a clock the
 * test moves. Every response the suite receives through `api` is checked against the served OpenAPI
 * document; a response that does not conform fails the test that received it.
 */
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { DependencyContainer } from 'tsyringe';
import { type Config, loadConfig } from '../../src/config/config.ts';
import { buildContainer, TOKENS } from '../../src/container.ts';
import { addSeconds } from '../../src/core/clock.ts';
import { newMessageId } from '../../src/core/ids.ts';
import type { ProvisionedInbox } from '../../src/core/inbox-service.ts';
import type {
  DeliverySummary,
  InboxStore,
  MessageStore,
  OptOutStore,
  RejectionInput,
} from '../../src/core/ports.ts';
import { createApiServer } from '../../src/daemons/api.ts';
import type { HttpServices } from '../../src/http/services.ts';
import type { Database } from '../../src/storage/database.ts';
import { FakeClock } from './clock.ts';
import { freshDatabase, type TestDatabase } from './database.ts';
import { OpenApiValidator } from './openapi-validator.ts';

export interface ApiResponse {
  status: number;
  headers: Headers;
  text: string;
  bytes: Buffer;
  // biome-ignore lint/suspicious/noExplicitAny: tests read arbitrary JSON fields
  json: any;
}

export interface RequestOptions {
  token?: string;
  /** An object is sent as JSON; a string is sent verbatim. */
  body?: unknown;
  headers?: Record<string, string>;
}

export class ApiClient {
  readonly baseUrl: string;
  readonly #validator: () => Promise<OpenApiValidator>;
  /** Every "METHOD /template status" seen, for coverage checks. */
  readonly seen: string[] = [];

  constructor(baseUrl: string) {
    this.baseUrl = baseUrl;
    let validator: Promise<OpenApiValidator> | undefined;
    this.#validator = () => {
      validator ??= fetch(`${baseUrl}/v1/openapi.json`)
        .then((r) => r.json())
        .then((doc) => new OpenApiValidator(doc));
      return validator;
    };
  }

  async request(method: string, pathOrUrl: string, options: RequestOptions = {}): Promise<ApiResponse> {
    const url = pathOrUrl.startsWith('http') ? pathOrUrl : `${this.baseUrl}${pathOrUrl}`;
    const headers: Record<string, string> = { ...options.headers };
    if (options.token !== undefined) headers.authorization = `Bearer ${options.token}`;
    let body: string | undefined;
    if (options.body !== undefined) {
      body = typeof options.body === 'string' ? options.body : JSON.stringify(options.body);
      headers['content-type'] ??= 'application/json';
    }
    const response = await fetch(url, { method, headers, body });
    const bytes = Buffer.from(await response.arrayBuffer());
    const text = bytes.toString('utf8');
    const contentType = response.headers.get('content-type');
    const path = new URL(url).pathname;
    const problems = (await this.#validator()).check(method, path, response.status, contentType, text);
    if (problems.length > 0) {
      throw new Error(
        `response does not conform to the OpenAPI document:\n${problems.join('\n')}\n${text.slice(0, 500)}`,
      );
    }
    this.seen.push(`${method} ${path} ${response.status}`);
    let json: unknown;
    if (contentType?.startsWith('application/json') && method !== 'HEAD') json = JSON.parse(text);
    return { status: response.status, headers: response.headers, text, bytes, json };
  }

  get = (path: string, options?: RequestOptions) => this.request('GET', path, options);
  head = (path: string, options?: RequestOptions) => this.request('HEAD', path, options);
  post = (path: string, options?: RequestOptions) => this.request('POST', path, options);
  put = (path: string, options?: RequestOptions) => this.request('PUT', path, options);
}

export interface DeliverOptions {
  envelopeFrom?: string;
  queueId?: string;
  summary?: Partial<DeliverySummary>;
  /** Split the body into pieces of this size, as a network stream would. */
  pieceBytes?: number;
}

export interface Harness {
  clock: FakeClock;
  config: Config & { secretKey: string };
  container: DependencyContainer;
  database: TestDatabase;
  api: ApiClient;
  messages: MessageStore;
  inboxes: InboxStore;
  optOuts: OptOutStore;
  /** Provisions through the API (provisioning is open in tests). */
  provision(senderDomains?: string[]): Promise<ProvisionedInbox>;
  /** Reserves and stores a message through the storage functions the mail path calls. */
  deliver(inboxId: string, raw: Buffer | string, options?: DeliverOptions): Promise<string>;
  /** Records a rejection as the policy daemon and milter will. */
  reject(
    inboxId: string,
    input: Partial<Omit<RejectionInput, 'inboxId' | 'now'>>,
  ): Promise<'recorded' | 'counted'>;
  close(): Promise<void>;
}

let queueCounter = 0;

export async function startHarness(
  env: Record<string, string> = {},
  options: { log?: (line: Record<string, unknown>) => void } = {},
): Promise<Harness> {
  const database = await freshDatabase();
  const clock = new FakeClock();
  const config = loadConfig({
    ENVIRONMENT: 'dev',
    PROVISIONING: 'open',
    MAIL_DOMAIN: 'inbox.test',
    API_PORT: '0',
    ...env,
    DATABASE_URL: database.url,
    SECRET_KEY: env.SECRET_KEY ?? 'test-secret-key-0123456789abcdefghijklmnop',
  }) as Config & { secretKey: string };
  const container = buildContainer(config, { clock, log: options.log ?? (() => {}), poolSize: 10 });
  const server: Server = await new Promise((resolve) => {
    const s = createApiServer(container.resolve<HttpServices>(TOKENS.HttpServices));
    s.listen(0, '127.0.0.1', () => resolve(s));
  });
  const { port } = server.address() as AddressInfo;
  // The base URL is only known once listening; the services read it per request.
  config.publicBaseUrl = `http://127.0.0.1:${port}`;
  const api = new ApiClient(config.publicBaseUrl);
  const messages = container.resolve<MessageStore>(TOKENS.MessageStore);

  const harness: Harness = {
    clock,
    config,
    container,
    database,
    api,
    messages,
    inboxes: container.resolve<InboxStore>(TOKENS.InboxStore),
    optOuts: container.resolve<OptOutStore>(TOKENS.OptOutStore),
    async provision(senderDomains) {
      const response = await api.post('/v1/inboxes', {
        body: senderDomains ? { sender_domains: senderDomains } : {},
      });
      if (response.status !== 201) throw new Error(`provision failed: ${response.status} ${response.text}`);
      return response.json as ProvisionedInbox;
    },
    async deliver(inboxId, raw, options = {}) {
      const bytes = typeof raw === 'string' ? Buffer.from(raw) : raw;
      const queueId = options.queueId ?? `TESTQ${process.pid}x${++queueCounter}`;
      const envelopeFrom = options.envelopeFrom ?? 'sender@example.com';
      const reserved = await messages.reserve({
        inboxId,
        messageId: newMessageId(),
        queueId,
        sizeBytes: bytes.length,
        envelopeFrom,
        now: clock.now(),
      });
      if (reserved === 'over_quota') throw new Error('over quota');
      const piece = options.pieceBytes ?? 64 * 1024;
      async function* body() {
        for (let i = 0; i < bytes.length; i += piece) yield bytes.subarray(i, i + piece);
      }
      const stored = await messages.store(
        {
          inboxId,
          queueId,
          envelopeFrom,
          now: clock.now(),
          summary: {
            fromName: null,
            fromAddress: envelopeFrom,
            subject: null,
            internetMessageId: null,
            authentication: null,
            ...options.summary,
          },
        },
        body(),
      );
      return stored.messageId;
    },
    reject(inboxId, input) {
      return messages.recordRejection(
        {
          inboxId,
          reason: 'quota',
          envelopeFrom: 'sender@example.com',
          senderDomain: null,
          sizeBytes: 1000,
          internetMessageId: null,
          ...input,
          now: clock.now(),
        },
        config.maxRejections,
        addSeconds(clock.now(), -config.rejectionRetentionSeconds),
      );
    },
    async close() {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
      await container.resolve<Database>(TOKENS.Database).close();
      await database.drop();
    },
  };
  return harness;
}
