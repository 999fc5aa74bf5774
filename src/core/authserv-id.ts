/**
 * authserv-id - the authserv-id of an Authentication-Results field (RFC 8601 section 2.2): the first
 * token of the value, before `;`, after any comments and folding whitespace; compared lowercased.
 */

/** The lowercased authserv-id of a field value, or null when there is none. */
export function authservIdOf(value: string): string | null {
  let depth = 0;
  let escaped = false;
  let token = '';
  for (const ch of value) {
    if (depth > 0) {
      if (escaped) escaped = false;
      else if (ch === '\\') escaped = true;
      else if (ch === '(') depth++;
      else if (ch === ')') depth--;
      continue;
    }
    if (ch === '(') {
      depth = 1;
      if (token) break;
      continue;
    }
    if (ch === '"' && !token) return quoted(value.slice(value.indexOf('"') + 1));
    if (ch === ';' || /\s/.test(ch)) {
      if (token) break;
      if (ch === ';') return null;
      continue;
    }
    token += ch;
  }
  return token ? token.toLowerCase() : null;
}

/** The rest of an RFC 5322 quoted-string (after its opening quote), unescaped and lowercased. */
function quoted(rest: string): string | null {
  let out = '';
  for (let i = 0; i < rest.length; i++) {
    const ch = rest[i] as string;
    if (ch === '\\') out += rest[++i] ?? '';
    else if (ch === '"') return out.trim() ? out.trim().toLowerCase() : null;
    else out += ch;
  }
  return null;
}
