import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { PollResponse } from '../src/core/poll-service.ts';
import { pollBody } from '../src/http/poll-body.ts';

const response = (messages: PollResponse['messages']): PollResponse => ({
  inbox: {
    inbox_id: 'a'.repeat(20),
    address: `${'a'.repeat(20)}@inbox.test`,
    state: 'live',
    created_at: '2026-11-21T10:00:00.000Z',
    expires_at: '2026-11-21T11:00:00.000Z',
    quota_bytes: 100,
    quota_used_bytes: 3,
    message_count: 1,
    rejection_count: 0,
    sender_domains: ['example.com'],
  },
  server_time: '2026-11-21T10:30:00.000Z',
  messages,
  rejections: Object.freeze([
    { at: 'x', envelope_from: 'a"b@c', reason: 'quota', sender_domain: null, size_bytes: 1 },
  ]),
  next_cursor: '1.5',
  next_url: 'http://h/v1/inboxes/x/messages?cursor=1.5&limit=50',
  has_more: false,
});

test('a poll body is exactly what JSON.stringify makes of the response, for kept and fresh pages alike', () => {
  const summary = {
    message_id: `msg_${'b'.repeat(20)}`,
    url: 'http://h/m',
    from: { name: 'Zoë "Z" \u2028', address: null },
    envelope_from: '',
    subject: 'line\nbreak',
    size_bytes: 3,
    received_at: 'r',
    downloaded_at: null,
    delete_after: 'd',
    internet_message_id: null,
    authentication: null,
  };
  const kept = Object.freeze([summary]);
  for (const r of [response(kept), response(kept), response([summary]), response([])]) {
    assert.equal(pollBody(r), JSON.stringify(r));
  }
});
