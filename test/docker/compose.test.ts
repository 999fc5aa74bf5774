/**
 * docker/compose.yaml without a Docker engine: it parses, its structure fits a schema of what the
 * stack uses, it references only files and pinned images that exist, every service has a health check
 * whose command is in its image, the ports and volumes are the issue's, the services' environments
 * load through the service's own configuration, and the addresses Postfix is given are where the
 * daemons listen. `docker compose config` runs too where the client plugin is installed.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { cp, mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { promisify } from 'node:util';
import Type from 'typebox';
import { Compile } from 'typebox/compile';
import { type Listen, loadConfig } from '../../src/config/config.ts';
import { renderPostfix } from '../../src/postfix/render.ts';
import {
  buildPaths,
  COMPOSE_FILE,
  containerEnvironment,
  DOCKER_DIR,
  ENV_EXAMPLE,
  interpolate,
  loadCompose,
  operatorEnv,
  parseCompose,
  parseEnvFile,
  REPO,
  REQUIRED_VALUES,
  type Service,
  variablesUsed,
} from './compose-file.ts';
import { imageFiles, parseDockerfile, pinnedImage } from './dockerfile.ts';

const run = promisify(execFile);

const compose = loadCompose();
const services = compose.services;
const APP_SERVICES = ['migrate', 'api', 'policy', 'milter', 'lmtp', 'jobs'];
const DAEMONS = { policy: 'POLICY_PORT', milter: 'MILTER_PORT', lmtp: 'LMTP_PORT' } as const;

const service = (name: string): Service => {
  const found = services[name];
  assert.ok(found, `service ${name}`);
  return found;
};

/** The files an image built from this service's Dockerfile holds, by path inside the image. */
function filesOf(s: Service): { files: Set<string>; workdir: string } {
  const { context, dockerfile } = buildPaths(s);
  const stages = parseDockerfile(readFileSync(dockerfile, 'utf8'));
  const workdir =
    stages
      .at(-1)
      ?.instructions.filter((i) => i.keyword === 'WORKDIR')
      .at(-1)?.args ?? '/';
  return { files: imageFiles(stages, context).files, workdir };
}

// The structure of the stack, as a schema: only keys the stack uses, with the values compose accepts.
const Str = Type.String({ minLength: 1 });
const Duration = Type.String({ pattern: '^\\d+(ms|s|m|h)$' });
const ServiceSchema = Type.Object(
  {
    image: Type.Optional(Str),
    build: Type.Optional(
      Type.Object({ context: Str, dockerfile: Type.Optional(Str) }, { additionalProperties: false }),
    ),
    command: Type.Optional(Type.Union([Str, Type.Array(Str, { minItems: 1 })])),
    init: Type.Optional(Type.Boolean()),
    restart: Type.Optional(
      Type.Union([
        Type.Literal('no'),
        Type.Literal('always'),
        Type.Literal('unless-stopped'),
        Type.Literal('on-failure'),
      ]),
    ),
    env_file: Type.Optional(Str),
    environment: Type.Optional(
      Type.Record(Type.String({ pattern: '^[A-Za-z_][A-Za-z0-9_]*$' }), Type.String()),
    ),
    depends_on: Type.Optional(
      Type.Record(
        Str,
        Type.Object(
          {
            condition: Type.Union([
              Type.Literal('service_started'),
              Type.Literal('service_healthy'),
              Type.Literal('service_completed_successfully'),
            ]),
          },
          { additionalProperties: false },
        ),
      ),
    ),
    ports: Type.Optional(Type.Array(Type.String({ pattern: '^(?:[0-9.]+:)?\\d+:\\d+$' }))),
    volumes: Type.Optional(Type.Array(Type.String({ pattern: '^[^:]+:/[^:]*(?::ro)?$' }))),
    healthcheck: Type.Object(
      {
        test: Type.Array(Str, { minItems: 2 }),
        interval: Duration,
        timeout: Duration,
        retries: Type.Integer({ minimum: 1 }),
        start_period: Duration,
      },
      { additionalProperties: false },
    ),
    stop_grace_period: Type.Optional(Duration),
    // Every container's log is rotated: Docker's default json-file driver keeps every line for ever.
    logging: Type.Object({ driver: Type.Literal('local') }, { additionalProperties: false }),
  },
  { additionalProperties: false },
);
const ComposeSchema = Type.Object(
  {
    name: Type.String({ pattern: '^[a-z0-9][a-z0-9_-]*$' }),
    services: Type.Record(Str, ServiceSchema),
    volumes: Type.Record(Str, Type.Null()),
  },
  { additionalProperties: false },
);

describe('docker/compose.yaml', () => {
  test('parses as YAML with its anchors merged, and fits the schema of the stack', () => {
    const raw = parseCompose();
    assert.ok(raw.services, 'a services map');
    const checker = Compile(ComposeSchema);
    // x- extensions hold the anchors; compose ignores them, and so does the schema.
    const document = Object.fromEntries(Object.entries(compose).filter(([key]) => !key.startsWith('x-')));
    const errors = [...checker.Errors(document)].map((e) => `${e.instancePath} ${e.message}`);
    assert.deepEqual(errors, []);
    // Top-level keys other than name/services/volumes must be x- extensions (compose ignores those).
    const text = readFileSync(COMPOSE_FILE, 'utf8');
    const topLevel = [...text.matchAll(/^([A-Za-z][\w-]*):/gm)].map((m) => m[1]);
    assert.deepEqual(
      topLevel.filter((k) => !k?.startsWith('x-')),
      ['name', 'services', 'volumes'],
    );
  });

  test('the schema check fails a service without a health check and an unknown condition', () => {
    const checker = Compile(ComposeSchema);
    const broken = structuredClone(compose);
    delete (broken.services.api as Service).healthcheck;
    (broken.services.jobs as Service).depends_on = { migrate: { condition: 'service_done' } };
    const paths = [...checker.Errors(broken)].map((e) => e.instancePath);
    assert.ok(paths.includes('/services/api'), paths.join(', '));
    assert.ok(
      paths.some((p) => p.startsWith('/services/jobs/depends_on/migrate')),
      paths.join(', '),
    );
  });

  test('has exactly the issue services: postgres, a one-shot migrate, five daemons and postfix', () => {
    assert.deepEqual(Object.keys(services).sort(), [
      'api',
      'jobs',
      'lmtp',
      'migrate',
      'milter',
      'policy',
      'postfix',
      'postgres',
    ]);
    for (const name of APP_SERVICES) {
      const s = service(name);
      assert.equal(s.image, 'agent-inbox:local', name);
      assert.deepEqual(s.build, { context: '..', dockerfile: 'docker/Dockerfile' }, name);
      assert.equal(s.command, name, `${name} runs the ${name} entry`);
    }
    assert.equal(service('migrate').restart, 'no', 'migrate runs once');
    for (const name of ['api', 'policy', 'milter', 'lmtp', 'jobs', 'postfix', 'postgres']) {
      assert.equal(service(name).restart, 'unless-stopped', name);
    }
  });

  test('starts in order: postgres healthy, then migrate completed, then the daemons, then postfix', () => {
    assert.deepEqual(service('migrate').depends_on, { postgres: { condition: 'service_healthy' } });
    for (const name of ['api', 'policy', 'milter', 'lmtp', 'jobs']) {
      assert.deepEqual(
        service(name).depends_on,
        { migrate: { condition: 'service_completed_successfully' } },
        name,
      );
    }
    assert.deepEqual(service('postfix').depends_on, {
      policy: { condition: 'service_healthy' },
      milter: { condition: 'service_healthy' },
      lmtp: { condition: 'service_healthy' },
    });
    assert.equal(service('postgres').depends_on, undefined);
    // No cycles: a topological order exists.
    const order: string[] = [];
    const visit = (name: string, path: string[]) => {
      assert.ok(!path.includes(name), `cycle: ${[...path, name].join(' -> ')}`);
      if (order.includes(name)) return;
      for (const dependency of Object.keys(service(name).depends_on ?? {}))
        visit(dependency, [...path, name]);
      order.push(name);
    };
    for (const name of Object.keys(services)) visit(name, []);
    assert.equal(order[0], 'postgres');
    assert.equal(order.at(-1), 'postfix');
  });

  test('every service has a health check, and its command exists in the service image', () => {
    for (const [name, s] of Object.entries(services)) {
      const check = s.healthcheck?.test;
      assert.ok(Array.isArray(check) && check[0] === 'CMD', `${name}: an exec-form health check`);
      if (!s.build) continue; // postgres: pg_isready is part of the official image
      const { files, workdir } = filesOf(s);
      const [, program, script] = check;
      if (program === 'node') {
        assert.ok(files.has(`${workdir}/${script}`), `${name}: ${script} is copied into ${workdir}`);
        assert.ok(existsSync(join(REPO, script as string)), `${name}: ${script} exists`);
      } else {
        assert.ok(files.has(program as string), `${name}: ${program} is copied into the image`);
      }
    }
    assert.deepEqual(service('postgres').healthcheck?.test, [
      'CMD',
      'pg_isready',
      '-h',
      '127.0.0.1',
      '-U',
      'inbox',
      '-d',
      'inbox',
    ]);
  });

  test("health checks ask each daemon's readiness on the port it serves it, and the database for migrate", () => {
    const probeOf = (name: string) => service(name).healthcheck?.test?.at(-1);
    const api = loadConfig(containerEnvironment(service('api')));
    assert.equal(probeOf('api'), `http://127.0.0.1:${api.apiPort}/readyz`, 'the API serves /readyz itself');
    for (const name of ['policy', 'milter', 'lmtp', 'jobs']) {
      const env = containerEnvironment(service(name));
      assert.match(env.METRICS_PORT ?? '', /^\d+$/, `${name}: a fixed METRICS_PORT`);
      assert.equal(probeOf(name), `http://127.0.0.1:${env.METRICS_PORT}/readyz`, name);
      // Reachable by the health check inside the container and by a Prometheus on the stack network.
      assert.equal(env.METRICS_HOST, '0.0.0.0', name);
    }
    assert.equal(probeOf('migrate'), 'database');
  });

  test('stop_grace_period outlasts the daemons own shutdown bound, so Docker never kills one', () => {
    // The stack sets the grace itself: a larger one in docker/.env (which reaches every service
    // container) would outlast stop_grace_period and get the daemon killed mid-delivery.
    const envFile = { ...operatorEnv(), SHUTDOWN_GRACE_SECONDS: '120' };
    for (const name of ['api', 'policy', 'milter', 'lmtp', 'jobs']) {
      const s = service(name);
      assert.match(s.environment?.SHUTDOWN_GRACE_SECONDS ?? '', /^\d+$/, `${name}: compose sets the grace`);
      const grace = loadConfig(containerEnvironment(s, envFile)).shutdownGraceSeconds;
      const period = Number(/^(\d+)s$/.exec(s.stop_grace_period ?? '')?.[1] ?? 10);
      assert.ok(period > grace + 10, `${name}: stop_grace_period ${period} s > ${grace} s grace + 10 s`);
    }
  });

  test('each service environment loads through the service configuration, listening on every interface', () => {
    for (const name of APP_SERVICES) {
      const config = loadConfig(containerEnvironment(service(name)));
      assert.equal(config.environment, 'prod', name);
      assert.equal(config.mailDomain, REQUIRED_VALUES.MAIL_DOMAIN, name);
      assert.equal(config.secretKey, REQUIRED_VALUES.SECRET_KEY, `${name} gets SECRET_KEY from docker/.env`);
      assert.equal(
        config.databaseUrl,
        `postgres://inbox:${REQUIRED_VALUES.POSTGRES_PASSWORD}@postgres:5432/inbox`,
        `${name} reaches the postgres service`,
      );
    }
    assert.equal(loadConfig(containerEnvironment(service('api'))).apiHost, '0.0.0.0');
    for (const [name, variable] of Object.entries(DAEMONS)) {
      assert.equal(
        service(name).environment?.[variable],
        `0.0.0.0:${{ policy: 10040, milter: 10041, lmtp: 10042 }[name]}`,
      );
    }
  });

  test('Postfix is pointed at the daemons by service name and port, and gets no secret', () => {
    const postfix = service('postfix');
    const config = loadConfig(containerEnvironment(postfix));
    for (const [name, variable] of Object.entries(DAEMONS)) {
      const target = config[`${name as keyof typeof DAEMONS}Listen`] as Listen;
      const listening = loadConfig(containerEnvironment(service(name)))[
        `${name as keyof typeof DAEMONS}Listen`
      ] as Listen;
      assert.ok('host' in target && 'port' in listening, variable);
      assert.equal(target.host, name, `${variable} names the ${name} service`);
      assert.ok(services[target.host], `${target.host} is a service`);
      assert.equal(target.port, listening.port, `${variable}: Postfix connects where ${name} listens`);
    }
    assert.equal(config.smtpHost, '*');
    assert.equal(config.smtpPort, 25);
    // Every address of both families: 0.0.0.0 rendered inet_protocols = ipv4, and IPv6 senders got no answer.
    const dirs = {
      configDirectory: '/c',
      queueDirectory: '/q',
      dataDirectory: '/d',
      maillogFile: '/l/maillog',
    };
    const { mainCf } = renderPostfix(config, dirs);
    assert.match(mainCf, /^inet_interfaces = all$/m);
    assert.match(mainCf, /^inet_protocols = all$/m);
    assert.equal(postfix.env_file, undefined, 'Postfix does not get docker/.env (SECRET_KEY)');
    assert.ok(!('SECRET_KEY' in (postfix.environment ?? {})));
    assert.ok(!('SECRET_KEY' in (service('postgres').environment ?? {})));
    // The settings both sides must agree on come from the same variables.
    for (const variable of ['MAIL_DOMAIN', 'AUTHSERV_ID', 'MAX_MESSAGE_BYTES', 'RESERVATION_TTL_SECONDS']) {
      assert.equal(postfix.environment?.[variable], service('lmtp').environment?.[variable], variable);
      assert.equal(postfix.environment?.[variable], service('milter').environment?.[variable], variable);
      assert.equal(postfix.environment?.[variable], service('jobs').environment?.[variable], variable);
    }
  });

  test('publishes only the API, on loopback port 8080 (plain HTTP, for a TLS proxy), and SMTP on IPv4 port 25', () => {
    const published = Object.entries(services)
      .filter(([, s]) => s.ports)
      .map(([name, s]) => [name, s.ports]);
    // SMTP on IPv4 only: an IPv6 client would come through docker-proxy from the bridge's gateway,
    // which has no PTR, and get a permanent 550 at connect.
    assert.deepEqual(published, [
      ['api', ['127.0.0.1:8080:8080']],
      ['postfix', ['0.0.0.0:25:25']],
    ]);
    const env = { ...operatorEnv(), API_PUBLISH: '127.0.0.1:8081', SMTP_PUBLISH: '2525' };
    assert.deepEqual(loadCompose(env).services.api?.ports, ['127.0.0.1:8081:8080']);
    assert.deepEqual(loadCompose(env).services.postfix?.ports, ['2525:25']);
    // An env file without the lines keeps the same defaults (compose.yaml's own).
    const unset = { ...operatorEnv(), API_PUBLISH: undefined, SMTP_PUBLISH: undefined };
    assert.deepEqual(loadCompose(unset).services.api?.ports, ['127.0.0.1:8080:8080']);
    assert.deepEqual(loadCompose(unset).services.postfix?.ports, ['0.0.0.0:25:25']);
  });

  test("the API's public base URL is the operator's, not a default", () => {
    const api = loadConfig(containerEnvironment(service('api')));
    assert.equal(api.publicBaseUrl, REQUIRED_VALUES.PUBLIC_BASE_URL);
    assert.throws(
      () => loadCompose({ ...operatorEnv(), PUBLIC_BASE_URL: '' }),
      /required variable PUBLIC_BASE_URL is missing a value/,
    );
  });

  test('keeps the database and the mail queue in named volumes, where the images keep them', () => {
    assert.deepEqual(Object.keys(compose.volumes ?? {}).sort(), ['postfix-queue', 'postgres-data']);
    assert.deepEqual(service('postgres').volumes, ['postgres-data:/var/lib/postgresql/data']);
    assert.deepEqual(service('postfix').volumes, ['postfix-queue:/var/spool/postfix']);
    const dockerfile = readFileSync(join(DOCKER_DIR, 'postfix', 'Dockerfile'), 'utf8');
    assert.match(dockerfile, /^VOLUME \["\/var\/spool\/postfix"\]$/m);
    const start = readFileSync(join(DOCKER_DIR, 'start', 'postfix.sh'), 'utf8');
    assert.match(start, /queue_directory=\$\{POSTFIX_QUEUE_DIRECTORY:-\/var\/spool\/postfix\}/);
    for (const name of APP_SERVICES) assert.equal(service(name).volumes, undefined, `${name} keeps no state`);
  });

  test('references only build contexts, Dockerfiles and env files that exist, and pinned images', () => {
    for (const [name, s] of Object.entries(services)) {
      assert.ok(s.image, `${name} names its image`);
      if (s.build) {
        const { context, dockerfile } = buildPaths(s);
        assert.ok(existsSync(join(context, 'package.json')), `${name}: the context is the repository root`);
        assert.ok(existsSync(dockerfile), `${name}: ${dockerfile}`);
        assert.match(s.image as string, /:local$/, `${name}: a locally built image is tagged :local`);
      } else {
        assert.ok(pinnedImage(s.image as string), `${name}: ${s.image} is pinned to a tag`);
      }
      if (s.env_file !== undefined) {
        assert.equal(s.env_file, '.env', name);
        assert.ok(existsSync(ENV_EXAMPLE), 'docker/.env.example, the file to copy to docker/.env');
      }
    }
    const gitignore = readFileSync(join(REPO, '.gitignore'), 'utf8');
    assert.match(gitignore, /^\/docker\/\.env$/m, 'docker/.env (secrets) is ignored by git');
  });

  test('every variable it uses has a default or is in docker/.env.example; the required ones fail when empty', () => {
    const example = parseEnvFile(readFileSync(ENV_EXAMPLE, 'utf8'));
    const used = variablesUsed(parseCompose());
    assert.ok(used.size > 0);
    for (const [name, { defaulted }] of used) {
      assert.ok(defaulted || name in example, `${name} has a default or is in .env.example`);
    }
    const required = [...used]
      .filter(([, u]) => u.required)
      .map(([name]) => name)
      .sort();
    assert.deepEqual(required, ['MAIL_DOMAIN', 'POSTGRES_PASSWORD', 'PUBLIC_BASE_URL']);
    for (const name of Object.keys(REQUIRED_VALUES))
      assert.equal(example[name], '', `${name} is left for the operator`);
    assert.throws(
      () => loadCompose(parseEnvFile(readFileSync(ENV_EXAMPLE, 'utf8'))),
      /required variable \w+ is missing/,
    );
  });

  test('interpolation follows compose: $$ escapes, :- for unset or empty, - for unset only', () => {
    // biome-ignore lint/suspicious/noTemplateCurlyInString: compose's syntax, not a template
    assert.equal(interpolate('a$${B}${C:-d}${E-f}$G', { E: '', G: 'g' }), 'a${B}dg');
  });

  test('it is accepted by docker compose config where the plugin is installed, else by the schema check', async (t) => {
    const plugin = await run('docker', ['compose', 'version', '--short']).catch((error: Error) => error);
    if (plugin instanceof Error) {
      // The fallback: no compose plugin here, so the schema of the stack is the check.
      t.diagnostic(`docker compose is not installed here (${plugin.message.split('\n')[0]}): schema check`);
      const document = Object.fromEntries(Object.entries(compose).filter(([key]) => !key.startsWith('x-')));
      assert.deepEqual([...Compile(ComposeSchema).Errors(document)].length, 0);
      return;
    }
    // A copy of docker/ with its .env, beside links to what the build context holds.
    const root = await mkdtemp(join(tmpdir(), 'compose-config-'));
    try {
      await cp(DOCKER_DIR, join(root, 'docker'), { recursive: true });
      const envText = Object.entries(operatorEnv())
        .map(([k, v]) => `${k}=${v}`)
        .join('\n');
      await writeFile(join(root, 'docker', '.env'), `${envText}\n`);
      for (const entry of [
        'package.json',
        'package-lock.json',
        'src',
        'migrations',
        'postfix',
        '.dockerignore',
      ]) {
        await symlink(join(REPO, entry), join(root, entry));
      }
      const { stdout } = await run(
        'docker',
        ['compose', '-f', join(root, 'docker', 'compose.yaml'), 'config', '--format', 'json'],
        {
          env: { PATH: process.env.PATH, HOME: process.env.HOME },
        },
      );
      const resolved = JSON.parse(stdout) as {
        name: string;
        services: Record<string, { ports?: { published: string; target: number }[] }>;
      };
      assert.equal(resolved.name, 'agent-inbox');
      assert.deepEqual(Object.keys(resolved.services).sort(), Object.keys(services).sort());
      assert.deepEqual(
        resolved.services.postfix?.ports?.map((p) => [String(p.published), p.target]),
        [['25', 25]],
      );
    } finally {
      await rm(root, { recursive: true, force: true });
    }
  });
});
