/**
 * poll-body - serializes a poll response. A page kept by the poll cache hands out the same (frozen)
 * message and rejection arrays to every poll until it ends, so their JSON is made once per page and
 * reused: a repeated poll costs one small stringify, not twenty summaries' worth.
 */
import type { PollResponse } from '../core/poll-service.ts';

const serialized = new WeakMap<readonly unknown[], string>();

function arrayJson(array: readonly unknown[]): string {
  let json = serialized.get(array);
  if (json === undefined) {
    json = JSON.stringify(array);
    if (Object.isFrozen(array)) serialized.set(array, json);
  }
  return json;
}

/** The same text JSON.stringify(response) gives. */
export function pollBody(response: PollResponse): string {
  return (
    `{"inbox":${JSON.stringify(response.inbox)},"server_time":${JSON.stringify(response.server_time)},` +
    `"messages":${arrayJson(response.messages)},"rejections":${arrayJson(response.rejections)},` +
    `"next_cursor":${JSON.stringify(response.next_cursor)},"next_url":${JSON.stringify(response.next_url)},` +
    `"has_more":${response.has_more}}`
  );
}
