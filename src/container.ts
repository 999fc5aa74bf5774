/**
 * container - the only place that wires implementations to interfaces (STYLE 10). Entry points build
 * a container and resolve what they run; tests build one with a fake clock.
 */
import 'reflect-metadata';
import { randomUUID } from 'node:crypto';
import { type DependencyContainer, instanceCachingFactory, container as rootContainer } from 'tsyringe';
import type { Config } from './config/config.ts';
import { Access } from './core/access.ts';
import { type Clock, systemClock } from './core/clock.ts';
import { type DeliveryReport, DeliveryService } from './core/delivery-service.ts';
import { DownloadService } from './core/download-service.ts';
import { InboxService } from './core/inbox-service.ts';
import { MessageAdmission } from './core/message-admission.ts';
import { OptOuts } from './core/opt-outs.ts';
import { PollService } from './core/poll-service.ts';
import type { Gatekeeper, MessageStore, OptOutStore } from './core/ports.ts';
import { RecipientAdmission } from './core/recipient-admission.ts';
import { ReservationLedger } from './core/reservation-ledger.ts';
import { Secrets } from './core/secrets.ts';
import { smtpReplies } from './core/smtp-replies.ts';
import type { HttpServices } from './http/services.ts';
import { createJobs } from './jobs/jobs.ts';
import { createLog, type Log } from './log.ts';
import { CachingLookup, createResolver, ResolverReverseDns } from './mail/dns.ts';
import { MailauthAuthenticator } from './mail/mailauth-authenticator.ts';
import { MilterCheck } from './mail/milter-check.ts';
import { Health } from './ops/health.ts';
import { Metrics, type VerdictLabel } from './ops/metrics.ts';
import { Database, isDatabaseUnavailable } from './storage/database.ts';
import { PgGatekeeper } from './storage/gatekeeper.ts';
import { InboxChangeFeed } from './storage/inbox-changes.ts';
import { PgInboxStore } from './storage/inbox-store.ts';
import { PgMessageStore } from './storage/message-store.ts';
import { PgMilterIncarnations } from './storage/milter-incarnations.ts';
import { PgOptOutStore } from './storage/opt-out-store.ts';
import { PgRecipientLookup } from './storage/recipient-lookup.ts';
import { PgSweeperStore } from './storage/sweeper-store.ts';

export const TOKENS = {
  Config: Symbol('Config'),
  Clock: Symbol('Clock'),
  Log: Symbol('Log'),
  Database: Symbol('Database'),
  InboxStore: Symbol('InboxStore'),
  RecipientLookup: Symbol('RecipientLookup'),
  InboxChangeFeed: Symbol('InboxChangeFeed'),
  MessageStore: Symbol('MessageStore'),
  OptOutStore: Symbol('OptOutStore'),
  Gatekeeper: Symbol('Gatekeeper'),
  Secrets: Symbol('Secrets'),
  Access: Symbol('Access'),
  OptOuts: Symbol('OptOuts'),
  InboxService: Symbol('InboxService'),
  PollService: Symbol('PollService'),
  DownloadService: Symbol('DownloadService'),
  HttpServices: Symbol('HttpServices'),
  Resolver: Symbol('Resolver'),
  ReverseDns: Symbol('ReverseDns'),
  Authenticator: Symbol('Authenticator'),
  SmtpReplies: Symbol('SmtpReplies'),
  RecipientAdmission: Symbol('RecipientAdmission'),
  MessageAdmission: Symbol('MessageAdmission'),
  ReservationLedger: Symbol('ReservationLedger'),
  MilterIncarnations: Symbol('MilterIncarnations'),
  MilterCheck: Symbol('MilterCheck'),
  DeliveryService: Symbol('DeliveryService'),
  SweeperStore: Symbol('SweeperStore'),
  Jobs: Symbol('Jobs'),
  Metrics: Symbol('Metrics'),
  Health: Symbol('Health'),
} as const;

export interface ContainerOptions {
  clock?: Clock;
  log?: Log;
  /** Connections in the pool (default 10; main.ts gives 20 to the all-in-one process). */
  poolSize?: number;
}

export function buildContainer(
  config: Config & { secretKey: string },
  options: ContainerOptions = {},
): DependencyContainer {
  const c = rootContainer.createChildContainer();
  const single = <T>(token: symbol, make: (c: DependencyContainer) => T) =>
    c.register<T>(token, { useFactory: instanceCachingFactory<T>(make) });
  const get = <T>(token: symbol) => c.resolve<T>(token);

  c.register(TOKENS.Config, { useValue: config });
  c.register(TOKENS.Clock, { useValue: options.clock ?? systemClock });
  c.register(TOKENS.Log, { useValue: options.log ?? createLog('api') });
  single(TOKENS.Database, () => new Database(config.databaseUrl, options.poolSize ?? 10));
  // One Registry per container, so per process in production and per test in the tests.
  single(TOKENS.Metrics, () => {
    const metrics = new Metrics();
    metrics.watchPool(() => get<Database>(TOKENS.Database).poolUse());
    return metrics;
  });
  single(TOKENS.Health, () => new Health(() => get<Database>(TOKENS.Database).ping(), get(TOKENS.Log)));
  single(TOKENS.InboxStore, () => new PgInboxStore(get(TOKENS.Database)));
  single(TOKENS.MessageStore, () => new PgMessageStore(get(TOKENS.Database)));
  single(TOKENS.RecipientLookup, () => new PgRecipientLookup(get(TOKENS.Database)));
  // Started by the policy daemon (daemons/policy.ts); until then the lookup keeps nothing.
  single(
    TOKENS.InboxChangeFeed,
    () =>
      new InboxChangeFeed(
        config.databaseUrl,
        get(TOKENS.Database),
        get<PgRecipientLookup>(TOKENS.RecipientLookup),
        get(TOKENS.Log),
      ),
  );
  single(TOKENS.OptOutStore, () => new PgOptOutStore(get(TOKENS.Database)));
  single(
    TOKENS.Gatekeeper,
    () =>
      new PgGatekeeper(get(TOKENS.Database), {
        poll: { burst: config.pollRateBurst, perSecond: config.pollRatePerSecond },
        download: { burst: config.downloadRateBurst, perSecond: config.downloadRatePerSecond },
      }),
  );
  single(TOKENS.Secrets, () => new Secrets(config.secretKey));
  single(TOKENS.OptOuts, () => new OptOuts(get<OptOutStore>(TOKENS.OptOutStore)));
  single(TOKENS.Access, () => new Access(get<Gatekeeper>(TOKENS.Gatekeeper), get(TOKENS.Clock), config));
  single(
    TOKENS.InboxService,
    () =>
      new InboxService(
        get(TOKENS.InboxStore),
        get(TOKENS.OptOuts),
        get(TOKENS.Secrets),
        get(TOKENS.Clock),
        config,
      ),
  );
  single(
    TOKENS.PollService,
    () => new PollService(get<MessageStore>(TOKENS.MessageStore), get(TOKENS.Clock), config),
  );
  single(
    TOKENS.DownloadService,
    () =>
      new DownloadService(get<MessageStore>(TOKENS.MessageStore), get(TOKENS.Clock), config, get(TOKENS.Log)),
  );
  single<HttpServices>(TOKENS.HttpServices, () => ({
    environment: config.environment,
    access: get(TOKENS.Access),
    inboxes: get(TOKENS.InboxService),
    polls: get(TOKENS.PollService),
    downloads: get(TOKENS.DownloadService),
    optOuts: get(TOKENS.OptOuts),
    log: get(TOKENS.Log),
    databaseUnavailable: isDatabaseUnavailable,
    health: get(TOKENS.Health),
    observe: (request) =>
      get<Metrics>(TOKENS.Metrics).httpRequest(
        request.method,
        request.route,
        request.status,
        request.seconds,
      ),
  }));
  single(TOKENS.Resolver, () => createResolver(config.dnsServers));
  single(TOKENS.ReverseDns, () => new ResolverReverseDns(get(TOKENS.Resolver)));
  single(
    TOKENS.Authenticator,
    () => new MailauthAuthenticator(config.authservId, new CachingLookup(get(TOKENS.Resolver))),
  );
  single(TOKENS.SmtpReplies, () => smtpReplies(config));
  single(
    TOKENS.RecipientAdmission,
    () =>
      new RecipientAdmission(
        get(TOKENS.InboxStore),
        get(TOKENS.RecipientLookup),
        get(TOKENS.MessageStore),
        get(TOKENS.ReverseDns),
        get(TOKENS.Clock),
        get(TOKENS.SmtpReplies),
        config,
      ),
  );
  single(
    TOKENS.MessageAdmission,
    () =>
      new MessageAdmission(
        get(TOKENS.InboxStore),
        get(TOKENS.MessageStore),
        get(TOKENS.Clock),
        get(TOKENS.SmtpReplies),
        config,
        get(TOKENS.ReservationLedger),
      ),
  );
  // One per process: its incarnation names the reservations it makes (mail/orphan-sweep.ts).
  single(TOKENS.ReservationLedger, () => new ReservationLedger(randomUUID(), get(TOKENS.Clock)));
  single(TOKENS.MilterIncarnations, () => new PgMilterIncarnations(get(TOKENS.Database)));
  single(
    TOKENS.MilterCheck,
    () => new MilterCheck(get(TOKENS.MessageAdmission), get(TOKENS.Authenticator), config.authservId),
  );
  single(
    TOKENS.DeliveryService,
    () =>
      new DeliveryService(get(TOKENS.MessageStore), get(TOKENS.Clock), config, get(TOKENS.Log), (report) =>
        get<Metrics>(TOKENS.Metrics).lmtpDelivery(deliveryMetrics(report)),
      ),
  );
  single(TOKENS.SweeperStore, () => new PgSweeperStore(get(TOKENS.Database)));
  single(TOKENS.Jobs, () => createJobs(get(TOKENS.SweeperStore), get(TOKENS.Clock), config, get(TOKENS.Log)));
  return c;
}

/** An LMTP delivery's recipients per outcome, as metric labels (DESIGN decision 1: only 2xx or 4xx). */
function deliveryMetrics(report: DeliveryReport) {
  const outcome = (verdict: VerdictLabel, count: number) => ({ verdict, count });
  return {
    seconds: report.ms / 1000,
    bytes: report.bytes,
    outcomes: {
      stored: outcome('accept', report.stored),
      duplicate: outcome('accept', report.duplicate),
      no_such_inbox: outcome('accept', report.discarded),
      inbox_cancelled: outcome('accept', report.cancelled),
      inbox_expired: outcome('accept', report.expired),
      reservation_released: outcome('accept', report.released),
      store_failed: outcome('defer', report.failed),
      too_many_recipients: outcome('defer', report.tooMany),
    },
  };
}
