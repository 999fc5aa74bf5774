import assert from 'node:assert/strict';
import { test } from 'node:test';
import pg from 'pg';
import { parseTimestamptz } from '../src/storage/database.ts';

test('timestamptz values as a UTC session prints them parse to the same instant as the general parser', () => {
  const general = pg.types.getTypeParser(1184, 'text') as (value: string) => Date;
  for (const text of [
    '2026-11-21 10:41:59+00',
    '2026-11-21 10:41:59.9+00',
    '2026-11-21 10:41:59.928+00',
    '2026-11-21 10:41:59.928123+00',
    '1999-12-31 23:59:59.999999+00',
    '2026-11-21 10:41:59.928+01',
  ]) {
    assert.equal(parseTimestamptz(text).getTime(), general(text).getTime(), text);
  }
});
