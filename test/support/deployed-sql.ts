/**
 * deployed-sql - a statement as a migration deployed it inside a PL/pgSQL function, for plan tests: the
 * text `pattern` captures in the function's source (all overloads), each PL/pgSQL variable turned into
 * a parameter so the statement can be PREPAREd on its own.
 */
import assert from 'node:assert/strict';
import type { Database } from '../../src/storage/database.ts';

/** `params`: [variable, parameter] pairs, replaced in the order given (`p_inbox_ids[i]` before `p_inbox_id`). */
export async function deployedSql(
  db: Database,
  fn: string,
  pattern: RegExp,
  params: [variable: string, parameter: string][],
): Promise<string> {
  const { rows } = await db.pool.query<{ src: string }>(
    'SELECT string_agg(prosrc, chr(10)) AS src FROM pg_proc WHERE proname = $1',
    [fn],
  );
  const text = pattern.exec(rows[0]?.src ?? '')?.[1];
  assert.ok(text, `${fn}: ${pattern} not found in its source`);
  return params.reduce((sql, [variable, parameter]) => sql.replaceAll(variable, parameter), text);
}

/** inbox_used_bytes' overdue sum as deployed: $1 the inbox, $2 the instant. */
export const overdueSum = (db: Database): Promise<string> =>
  deployedSql(db, 'inbox_used_bytes', /\((SELECT sum\(size_bytes\) FROM messages\s+WHERE [\s\S]*?)\), 0\)/, [
    ['p_inbox_id', '$1'],
    ['p_now', '$2'],
  ]);
