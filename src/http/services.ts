/**
 * services - what the HTTP adapter calls. Built by the container (src/container.ts) or by a test.
 */
import type { Access } from '../core/access.ts';
import type { DownloadService } from '../core/download-service.ts';
import type { InboxService } from '../core/inbox-service.ts';
import type { OptOuts } from '../core/opt-outs.ts';
import type { PollService } from '../core/poll-service.ts';
import type { Readiness } from '../ops/health.ts';
import type { Logger } from './error-middleware.ts';

/** One request, answered: `route` is the route template (`/v1/inboxes/:id`), `unmatched` for none. */
export interface RequestReport {
  method: string;
  route: string;
  status: number;
  seconds: number;
}

export interface HttpServices {
  environment: 'dev' | 'prod';
  access: Access;
  inboxes: InboxService;
  polls: PollService;
  downloads: DownloadService;
  optOuts: OptOuts;
  log: Logger;
  /** Whether an error means the database is away (logged briefly and at most every 10 s). */
  databaseUnavailable?: (error: unknown) => boolean;
  /** Readiness for `GET /readyz`. */
  health: { ready(): Promise<Readiness> };
  /** Called once per request when its response has ended or the client went away (metrics). */
  observe: (request: RequestReport) => void;
}
