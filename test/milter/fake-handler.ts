/**
 * fake-handler - a MilterHandler for tests that records what the adapter hands the core and lets each
 * test script the consumer (throw at begin, slow body, verdicts, edits), plus a started server and a log
 * that keeps its lines.
 */
import { ACCEPT, type Verdict } from '../../src/core/verdict.ts';
import type { LogLine } from '../../src/log.ts';
import type {
  HeaderEdits,
  MessageAnswer,
  MessageConsumer,
  MilterEnvelope,
  MilterHandler,
  MilterHeader,
} from '../../src/milter/handler.ts';
import { type MilterServer, startMilterServer } from '../../src/milter/server.ts';

export interface Recorded {
  envelope: MilterEnvelope;
  headers: MilterHeader[];
  chunks: Buffer[];
  ended: number;
  aborted: number;
  delivered: number;
  undelivered: number;
}

export class FakeHandler implements MilterHandler {
  readonly messages: Recorded[] = [];
  /** Every answered() call: queue id and the answer as sent ('tempfail', or the verdict's kind and code). */
  readonly answers: [string, string][] = [];
  begin: (envelope: MilterEnvelope) => void = () => {};
  body: (chunk: Buffer, message: Recorded) => Promise<void> = async () => {};
  end: (message: Recorded) => Promise<{ verdict: Verdict; edits?: HeaderEdits }> = async () => ({
    verdict: ACCEPT,
  });

  answered(message: { queueId: string }, answer: MessageAnswer): void {
    this.answers.push([
      message.queueId,
      answer === 'tempfail'
        ? 'tempfail'
        : answer.kind === 'accept'
          ? 'accept'
          : `${answer.code} ${answer.dsn}`,
    ]);
  }

  beginMessage(envelope: MilterEnvelope, headers: MilterHeader[]): MessageConsumer {
    this.begin(envelope);
    const message: Recorded = {
      envelope,
      headers,
      chunks: [],
      ended: 0,
      aborted: 0,
      delivered: 0,
      undelivered: 0,
    };
    this.messages.push(message);
    return {
      body: (chunk) => {
        message.chunks.push(Buffer.from(chunk));
        return this.body(chunk, message);
      },
      end: () => {
        message.ended++;
        return this.end(message);
      },
      abort: () => {
        message.aborted++;
      },
      delivered: () => {
        message.delivered++;
      },
      undelivered: async () => {
        message.undelivered++;
      },
    };
  }
}

export interface Started {
  milter: MilterServer;
  handler: FakeHandler;
  logs: LogLine[];
}

export async function startFake(progressIntervalMs?: number, decisionDeadlineMs?: number): Promise<Started> {
  const handler = new FakeHandler();
  const logs: LogLine[] = [];
  const milter = await startMilterServer({
    listen: { host: '127.0.0.1', port: 0 },
    handler,
    log: (line) => logs.push(line),
    ...(progressIntervalMs === undefined ? {} : { progressIntervalMs }),
    ...(decisionDeadlineMs === undefined ? {} : { decisionDeadlineMs }),
  });
  return { milter, handler, logs };
}

export const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));
