/**
 * coalesce-writes - makes every write a socket gets within one tick leave in one system call.
 *
 * For servers that write each protocol reply on its own: smtp-server answers Postfix's pipelined
 * XFORWARD, MAIL, RCPT and DATA with four socket.write calls, each a syscall here and a wakeup of
 * Postfix's lmtp process there; the milter answers end of message with header edits, then continue. The first write of a tick corks the socket and schedules
 * the uncork for the end of that tick, so the replies go out together, in order, as one writev.
 * end() uncorks as usual; an uncork on a socket that is no longer corked does nothing.
 */
import type { Socket } from 'node:net';

export function coalesceWrites(socket: Socket): void {
  const write = socket.write;
  const uncork = () => socket.uncork();
  socket.write = function coalescedWrite(this: Socket, ...args: Parameters<Socket['write']>): boolean {
    if (this.writableCorked === 0) {
      this.cork();
      process.nextTick(uncork);
    }
    return write.apply(this, args);
  } as Socket['write'];
}
