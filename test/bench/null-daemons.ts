/**
 * null-daemons - a policy server and a milter that decide nothing, for mail-bench's ceiling run: the
 * same Postfix configuration as ours (policy checks at RCPT, and at CONNECT for clients without a
 * verified name; a milter with the same negotiated events and one inserted header), delivering to the
 * null LMTP sink. What that run loses against the bare sink is the cost of Postfix's own side of the
 * hooks, which no work in our daemons can win back; what ours loses beyond it is ours.
 *
 * Both use the production codecs (framing, negotiation), so Postfix sees the same conversation shape;
 * neither looks anything up.
 */
import { createServer, type Server, type Socket } from 'node:net';
import {
  encodeContinue,
  encodeInsertHeader,
  encodeNegotiation,
  FrameDecoder,
  SMFIC,
} from '../../src/milter/codec.ts';
import { expectsReply, negotiate } from '../../src/milter/negotiate.ts';

/** Answers every policy request `action=DUNNO`; requests end with an empty line. */
export function nullPolicyServer(): Server {
  return createServer((socket) => {
    let pending = '';
    socket.setEncoding('latin1');
    socket.on('data', (text: string) => {
      pending += text;
      let end = pending.indexOf('\n\n');
      while (end >= 0) {
        socket.write('action=DUNNO\n\n');
        pending = pending.slice(end + 2);
        end = pending.indexOf('\n\n');
      }
    });
    socket.on('error', () => socket.destroy());
  });
}

/** Negotiates as our milter does, continues every event that waits for a reply, adds one header. */
export function nullMilterServer(): Server {
  return createServer((socket: Socket) => {
    const decoder = new FrameDecoder();
    let protocol = 0;
    socket.on('data', (chunk: Buffer) => {
      const replies: Buffer[] = [];
      for (const packet of decoder.push(chunk)) {
        if (packet.command === SMFIC.OPTNEG) {
          const result = negotiate({
            version: packet.data.readUInt32BE(0),
            actions: packet.data.readUInt32BE(4),
            protocol: packet.data.readUInt32BE(8),
          });
          if (!result.ok) throw new Error(result.reason);
          protocol = result.reply.protocol;
          replies.push(encodeNegotiation(result.reply));
        } else if (packet.command === SMFIC.QUIT) {
          socket.end();
        } else if (packet.command === SMFIC.BODYEOB) {
          replies.push(encodeInsertHeader(0, 'Authentication-Results', ' mx.svc.test; none'));
          replies.push(encodeContinue());
        } else if (expectsReply(packet.command, protocol)) {
          replies.push(encodeContinue());
        }
      }
      if (replies.length > 0) socket.write(Buffer.concat(replies));
    });
    socket.on('error', () => socket.destroy());
  });
}
