/**
 * test-receiver - the LMTP receiver as the receiver tests start it: a DeliveryService over the
 * harness's storage, clock and mail domain, behind smtp-server on loopback (or `listen`).
 */
import type { Listen } from '../../src/config/config.ts';
import type { Clock } from '../../src/core/clock.ts';
import { DeliveryService, type DeliverySettings } from '../../src/core/delivery-service.ts';
import type { MessageStore } from '../../src/core/ports.ts';
import { type LmtpServer, startLmtpServer } from '../../src/lmtp/server.ts';
import type { Log } from '../../src/log.ts';
import type { Harness } from '../support/harness.ts';

export interface TestReceiverOptions {
  listen?: Listen;
  /** The server's log; also the service's unless `serviceLog` is given. */
  log?: Log;
  serviceLog?: Log;
  /** Instead of the harness's store (e.g. one on its own pool). */
  store?: MessageStore;
  settings?: Partial<DeliverySettings>;
  /** Instead of the harness's clock. */
  clock?: Clock;
  maxMessageBytes?: number;
  closeGraceMs?: number;
}

export function startTestReceiver(
  h: Pick<Harness, 'messages' | 'clock' | 'config'>,
  options: TestReceiverOptions = {},
): Promise<LmtpServer> {
  const log = options.log ?? (() => {});
  const service = new DeliveryService(
    options.store ?? h.messages,
    options.clock ?? h.clock,
    { mailDomain: h.config.mailDomain, authservId: h.config.authservId, ...options.settings },
    options.serviceLog ?? log,
  );
  return startLmtpServer({
    listen: options.listen ?? { host: '127.0.0.1', port: 0 },
    handler: service,
    log,
    hostname: 'lmtp.inbox.test',
    maxMessageBytes: options.maxMessageBytes ?? h.config.maxMessageBytes,
    ...(options.closeGraceMs === undefined ? {} : { closeGraceMs: options.closeGraceMs }),
  });
}
