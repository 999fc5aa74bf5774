/**
 * held-dns - a DNS server on a UDP port of 127.0.0.1 that answers every query NXDOMAIN, but only once
 * released: while held, queries wait. It lets a test keep a daemon's decision in flight (the policy
 * daemon's PTR lookup, the milter's SPF and DMARC lookups) for as long as it needs.
 */
import dgram from 'node:dgram';

export interface HeldDns {
  /** `127.0.0.1:port`, for DNS_SERVERS. */
  address: string;
  /** Names asked for, in order. */
  names: string[];
  /** Resolves once a query has arrived (at once if one already has). */
  queried(): Promise<void>;
  /** Answers the queries waiting, and every later one at once. */
  release(): void;
  close(): Promise<void>;
}

export async function startHeldDns(): Promise<HeldDns> {
  const socket = dgram.createSocket('udp4');
  const waiting: { query: Buffer; port: number }[] = [];
  const names: string[] = [];
  const wakers: (() => void)[] = [];
  let held = true;
  const answer = (query: Buffer, port: number) => socket.send(nxdomain(query), port, '127.0.0.1');
  socket.on('message', (query, peer) => {
    names.push(questionName(query));
    for (const wake of wakers.splice(0)) wake();
    if (held) waiting.push({ query, port: peer.port });
    else answer(query, peer.port);
  });
  await new Promise<void>((resolve) => socket.bind(0, '127.0.0.1', resolve));
  return {
    address: `127.0.0.1:${socket.address().port}`,
    names,
    queried: () =>
      names.length > 0 ? Promise.resolve() : new Promise<void>((resolve) => wakers.push(resolve)),
    release() {
      held = false;
      for (const { query, port } of waiting.splice(0)) answer(query, port);
    },
    close: () => new Promise<void>((resolve) => socket.close(() => resolve())),
  };
}

/** The question's name: length-prefixed labels from byte 12 (RFC 1035 4.1.2). */
function questionName(query: Buffer): string {
  const labels: string[] = [];
  for (let at = 12; at < query.length && query[at] !== 0; at += (query[at] ?? 0) + 1) {
    labels.push(query.subarray(at + 1, at + 1 + (query[at] ?? 0)).toString('latin1'));
  }
  return labels.join('.');
}

/** The header and question of `query`, as a response with RCODE 3 (name error) and no records. */
function nxdomain(query: Buffer): Buffer {
  let end = 12;
  while (end < query.length && query[end] !== 0) end += (query[end] ?? 0) + 1;
  const response = Buffer.from(query.subarray(0, end + 5));
  // QR, the client's RD, RA, RCODE 3.
  response.writeUInt16BE(0x8083 | (query.readUInt16BE(2) & 0x0100), 2);
  response.writeUInt16BE(1, 4);
  response.writeUInt32BE(0, 6);
  response.writeUInt16BE(0, 10);
  return response;
}
