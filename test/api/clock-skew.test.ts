/**
 * An API process whose clock disagrees with PostgreSQL's (core/clock-check.ts) decides nothing on it:
 * every request that needs the time answers `500 internal`, logged once per UNAVAILABLE_LOG_MS
 * without a stack, as during a database outage; and it answers as before once the clocks agree.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { CheckedClock } from '../../src/core/clock-check.ts';
import { startApiProcess } from '../support/api-process.ts';
import { type Harness, startHarness } from '../support/harness.ts';

let h: Harness;
before(async () => {
  h = await startHarness();
});
after(() => h.close());

test('while the clock is off, requests answer 500 logged once without a stack; then as before', async () => {
  const inbox = await h.provision();
  const clock = new CheckedClock(h.clock);
  const lines: Record<string, unknown>[] = [];
  const other = await startApiProcess(h, { clock, log: (line) => lines.push(line) });
  try {
    const api = other.api;
    const status = () => api.get(`/v1/inboxes/${inbox.inbox_id}`, { token: inbox.credentials.reader });
    clock.skewed = "this host's clock is 1200 s ahead of PostgreSQL's (more than 30 s)";
    for (let i = 0; i < 5; i++) {
      const response = await status();
      assert.equal(response.status, 500);
      assert.equal(response.json.error.code, 'internal');
    }
    const errors = lines.filter((line) => line.level === 'error');
    assert.deepEqual(
      errors.map((line) => [line.cause, line.left_out]),
      [['clock', 0]],
    );
    assert.doesNotMatch(String(errors[0]?.error), /\n\s+at /, 'no stack');
    clock.skewed = null;
    assert.equal((await status()).status, 200);
  } finally {
    await other.close();
  }
});
