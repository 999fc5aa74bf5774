/**
 * coalesce-writes - makes every write a socket gets within one turn of the event loop leave in one
 * system call.
 *
 * For servers that write each protocol reply on its own: smtp-server answers Postfix's pipelined
 * XFORWARD, MAIL, RCPT and DATA with a socket.write each, a syscall here and a wakeup of Postfix's lmtp
 * process there; the milter answers end of message with header edits, then continue. The first write
 * corks the socket and schedules the uncork with setImmediate, which runs once the I/O callback that
 * wrote, and every promise continuation and nextTick it started, have run: the replies go out together,
 * in order, as one writev. (An uncork on nextTick runs before promise continuations, so a reply written
 * once a handler's promise settles left in a write of its own.) A reply that itself waits for a
 * setImmediate still leaves on its own: smtp-server's default onMailFrom did, so the receiver answers
 * MAIL at once (lmtp/server.ts). end() uncorks as usual; an uncork on a socket that is no longer
 * corked does nothing.
 */
import type { Socket } from 'node:net';

export function coalesceWrites(socket: Socket): void {
  const write = socket.write;
  const uncork = () => socket.uncork();
  socket.write = function coalescedWrite(this: Socket, ...args: Parameters<Socket['write']>): boolean {
    if (this.writableCorked === 0) {
      this.cork();
      setImmediate(uncork);
    }
    return write.apply(this, args);
  } as Socket['write'];
}
