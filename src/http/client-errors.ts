/**
 * client-errors - answers requests Node's HTTP parser refuses before Koa sees them (headers over its
 * limit, a request that is not HTTP/1.1, a request that takes too long to arrive) with the contract's
 * error body (section 7) instead of Node's bare, bodiless 400/431/408: `400 invalid_request`, field
 * `request`, and the connection closed (after the answer is written, whether or not the client closes
 * its side).
 */
import type { Server } from 'node:http';
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';

interface Responding {
  _headerSent?: boolean;
  req?: { complete?: boolean };
}

export function answerClientErrors(server: Server): void {
  server.on('clientError', (error: NodeJS.ErrnoException, socket: Duplex) => {
    // A response is under way on this connection. If its request is still arriving, the error is that
    // request's own (its body timed out, a bad chunk): it gets our 400, if no byte of its response has
    // gone out. Otherwise the error is a pipelined request's behind it, and a 400 would be read as the
    // answer to a request that was (or is being) carried out: the connection is dropped instead.
    const current = (socket as Duplex & { _httpMessage?: Responding })._httpMessage;
    const own =
      current === undefined || current === null || (!current._headerSent && current.req?.complete === false);
    if (error.code === 'ECONNRESET' || !socket.writable || !own) {
      socket.destroy();
      return;
    }
    const message =
      error.code === 'ERR_HTTP_REQUEST_TIMEOUT'
        ? 'The request did not arrive in time.'
        : error.code === 'HPE_HEADER_OVERFLOW'
          ? 'The request headers are too large.'
          : 'The request is not valid HTTP/1.1.';
    const body = JSON.stringify({
      error: { code: 'invalid_request', message, details: { field: 'request' } },
    });
    socket.write(
      [
        'HTTP/1.1 400 Bad Request',
        'Content-Type: application/json; charset=utf-8',
        `Content-Length: ${Buffer.byteLength(body)}`,
        'Cache-Control: no-store',
        'Connection: close',
        '',
        body,
      ].join('\r\n'),
    );
    (socket as Socket).destroySoon();
  });
}
