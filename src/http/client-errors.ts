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

export function answerClientErrors(server: Server): void {
  server.on('clientError', (error: NodeJS.ErrnoException, socket: Duplex) => {
    // A response whose bytes have begun to go out on this connection (a pipelined bad request during a
    // download): ours would land inside its body. Node's own handler drops the connection then; so do we.
    const current = (socket as Duplex & { _httpMessage?: { _headerSent?: boolean } })._httpMessage;
    if (error.code === 'ECONNRESET' || !socket.writable || current?._headerSent) {
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
