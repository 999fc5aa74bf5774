/**
 * message-routes - poll, download and inspect (contract section 4).
 */
import { Readable } from 'node:stream';
import type Router from '@koa/router';
import { decodeCursor } from '../../core/cursor.ts';
import { messageNotFound } from '../../core/download-service.ts';
import { invalidRequest, noEndpoint } from '../../core/errors.ts';
import { MESSAGE_ID } from '../../core/ids.ts';
import { pollBody } from '../poll-body.ts';
import { integerParameter, queryParameters } from '../request.ts';
import type { HttpServices } from '../services.ts';
import { inboxRoute } from './inbox-route.ts';

export function registerMessageRoutes(router: Router, services: HttpServices): void {
  const { polls, downloads } = services;

  // @koa/router answers HEAD with the GET route; the contract defines no HEAD for poll, and a poll lists
  // (it starts the unclaimed timer), so HEAD is a path no endpoint serves.
  router.head('/v1/inboxes/:id/messages', () => {
    throw noEndpoint();
  });
  router.get(
    '/v1/inboxes/:id/messages',
    inboxRoute(
      services,
      { ownerOnly: false, bucket: 'poll', withUsage: true },
      (ctx) => {
        const query = queryParameters(ctx, ['cursor', 'limit']);
        const limit = integerParameter(query.limit, 'limit', 1, 200, 50);
        if (query.cursor === undefined) return { after: 0, limit };
        const after = decodeCursor(query.cursor);
        if (after === undefined) throw invalidRequest('cursor', 'This cursor was not issued by the service.');
        return { after, limit };
      },
      async (caller, { after, limit }, ctx, usage) => {
        if (!usage) throw new Error('poll admitted without usage');
        ctx.type = 'application/json';
        ctx.body = pollBody(await polls.poll(caller, after, limit, usage));
      },
    ),
  );

  // @koa/router answers HEAD with the GET route; HEAD must not start the deletion timer.
  router.get(
    '/v1/inboxes/:id/messages/:msg',
    inboxRoute(
      services,
      { ownerOnly: false, bucket: 'download' },
      (ctx) => {
        if (!MESSAGE_ID.test(String(ctx.params.msg))) throw messageNotFound();
        queryParameters(ctx, []);
        return String(ctx.params.msg);
      },
      async (caller, messageId, ctx) => {
        const isGet = ctx.method === 'GET';
        const range = ctx.get('Range') || undefined;
        const download = await downloads.download(
          caller,
          messageId,
          range,
          isGet,
          ctx.get('If-Range') || undefined,
        );
        const size = download.message.sizeBytes;
        ctx.status = download.partial ? (isGet ? 206 : 200) : 200;
        ctx.set('ETag', download.etag);
        ctx.set('Accept-Ranges', 'bytes');
        if (download.partial) ctx.set('Content-Range', `bytes ${download.start}-${download.end}/${size}`);
        if (download.body) ctx.body = Readable.from(download.body, { objectMode: false });
        ctx.type = 'message/rfc822';
        ctx.length = Math.max(0, download.end - download.start + 1);
      },
    ),
  );
}
