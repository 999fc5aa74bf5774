/**
 * compose-file - reads docker/compose.yaml the way `docker compose` does, without Docker: YAML with
 * anchors and merge keys (`<<`), then `${...}` interpolation from an environment (the compose
 * specification's forms: `$VAR`, `${VAR}`, `${VAR:-default}`, `${VAR-default}`, `${VAR:?error}`,
 * `${VAR?error}`, `$$`). Also reads env files (`VAR=value` lines).
 */
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse } from 'yaml';

export const REPO = fileURLToPath(new URL('../../', import.meta.url));
export const DOCKER_DIR = join(REPO, 'docker');
export const COMPOSE_FILE = join(DOCKER_DIR, 'compose.yaml');
export const ENV_EXAMPLE = join(DOCKER_DIR, '.env.example');

/** What the operator fills into docker/.env; the example leaves them empty on purpose. */
export const REQUIRED_VALUES = {
  MAIL_DOMAIN: 'inbox.example.test',
  SECRET_KEY: 'k'.repeat(40),
  POSTGRES_PASSWORD: 'compose-test-password',
  PUBLIC_BASE_URL: 'https://inbox-api.example.test',
};

export interface Healthcheck {
  test?: string[] | string;
  disable?: boolean;
  interval?: string;
  timeout?: string;
  retries?: number;
  start_period?: string;
}

export interface Service {
  image?: string;
  build?: { context: string; dockerfile?: string };
  command?: string | string[];
  init?: boolean;
  restart?: string;
  env_file?: string | string[];
  environment?: Record<string, string>;
  depends_on?: Record<string, { condition: string }>;
  ports?: string[];
  volumes?: string[];
  healthcheck?: Healthcheck;
  stop_grace_period?: string;
  logging?: { driver: string };
}

export interface ComposeFile {
  name?: string;
  services: Record<string, Service>;
  volumes?: Record<string, unknown>;
}

/** `VAR=value` lines; blank lines and `#` comments skipped. Values are taken literally. */
export function parseEnvFile(text: string): Record<string, string> {
  const env: Record<string, string> = {};
  for (const line of text.split('\n')) {
    const trimmed = line.trim();
    if (trimmed === '' || trimmed.startsWith('#')) continue;
    const match = /^([A-Za-z_][A-Za-z0-9_]*)=(.*)$/.exec(trimmed);
    if (!match?.[1]) throw new Error(`not a VAR=value line: ${line}`);
    env[match[1]] = match[2] ?? '';
  }
  return env;
}

/** Every variable a `${...}` or `$VAR` in the document's strings names, and how it is used. */
export function variablesUsed(node: unknown): Map<string, { defaulted: boolean; required: boolean }> {
  const used = new Map<string, { defaulted: boolean; required: boolean }>();
  const visit = (value: unknown): void => {
    if (Array.isArray(value)) value.forEach(visit);
    else if (value !== null && typeof value === 'object') Object.values(value).forEach(visit);
    else if (typeof value === 'string') {
      for (const match of value
        .replaceAll('$$', '')
        .matchAll(/\$(?:\{([A-Za-z_]\w*)(:?[-?])?[^}]*\}|([A-Za-z_]\w*))/g)) {
        const operator = match[2] ?? '';
        used.set(match[1] ?? match[3] ?? '', {
          defaulted: operator.endsWith('-'),
          required: operator.endsWith('?'),
        });
      }
    }
  };
  visit(node);
  return used;
}

/** Substitutes one string; throws like compose does for a `?` variable that is missing. */
export function interpolate(value: string, env: Record<string, string | undefined>): string {
  return value.replace(
    /\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?)([-?])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)/g,
    (whole, braced?: string, colon?: string, operator?: string, argument?: string, bare?: string) => {
      if (whole === '$$') return '$';
      const name = (braced ?? bare) as string;
      const current = env[name];
      const missing = colon === ':' ? current === undefined || current === '' : current === undefined;
      if (operator === '-') return missing ? (argument ?? '') : (current as string);
      if (operator === '?') {
        if (missing) throw new Error(`required variable ${name} is missing a value: ${argument}`);
        return current as string;
      }
      return current ?? '';
    },
  );
}

function interpolateTree(node: unknown, env: Record<string, string | undefined>): unknown {
  if (typeof node === 'string') return interpolate(node, env);
  if (Array.isArray(node)) return node.map((item) => interpolateTree(item, env));
  if (node !== null && typeof node === 'object') {
    return Object.fromEntries(Object.entries(node).map(([k, v]) => [k, interpolateTree(v, env)]));
  }
  return node;
}

/** The raw document: merge keys applied, nothing interpolated. */
export function parseCompose(text: string = readFileSync(COMPOSE_FILE, 'utf8')): ComposeFile {
  return parse(text, { merge: true, strict: true, uniqueKeys: true }) as ComposeFile;
}

/** The example env file with the required values filled in: what a new operator's docker/.env holds. */
export function operatorEnv(): Record<string, string> {
  return { ...parseEnvFile(readFileSync(ENV_EXAMPLE, 'utf8')), ...REQUIRED_VALUES };
}

/** The document as compose sees it with that env file; non-string scalars (numbers, booleans) kept. */
export function loadCompose(env: Record<string, string | undefined> = operatorEnv()): ComposeFile {
  return interpolateTree(parseCompose(), env) as ComposeFile;
}

/** A service's full environment inside its container: its env_file (docker/.env), then `environment`. */
export function containerEnvironment(
  service: Service,
  envFile: Record<string, string> = operatorEnv(),
): Record<string, string> {
  const fromFile = service.env_file === undefined ? {} : envFile;
  return { ...fromFile, ...(service.environment ?? {}) };
}

/** A path in a service's build section, resolved like compose does (context relative to the file). */
export function buildPaths(service: Service): { context: string; dockerfile: string } {
  if (!service.build) throw new Error('no build section');
  const context = join(dirname(COMPOSE_FILE), service.build.context);
  return { context, dockerfile: join(context, service.build.dockerfile ?? 'Dockerfile') };
}
