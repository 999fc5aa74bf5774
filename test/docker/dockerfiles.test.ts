/**
 * The Dockerfiles in docker/, linted without Docker (test/docker/dockerfile.ts): pinned base images,
 * no ADD, COPY sources that exist and are not ignored, exec-form ENTRYPOINT/CMD/HEALTHCHECK, apt lists
 * removed, a non-root user for the service, no second Node from the npm package `node`; and the start
 * scripts they run are POSIX sh with `set -eu`, executable, and copied into the images.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { promisify } from 'node:util';
import { DOCKER_DIR, REPO } from './compose-file.ts';
import { execForm, imageFiles, lintDockerfile, parseDockerfile } from './dockerfile.ts';

const run = promisify(execFile);

const APP = join(DOCKER_DIR, 'Dockerfile');
const POSTFIX = join(DOCKER_DIR, 'postfix', 'Dockerfile');
const START = join(DOCKER_DIR, 'start');
const read = (path: string) => readFileSync(path, 'utf8');
const ROOT_REASON = "Postfix's master binds port 25 and starts its daemons as the postfix user";

describe('the Dockerfile lint', () => {
  test('finds each problem it looks for', () => {
    const bad = [
      'FROM node AS deps',
      'RUN npm install',
      'FROM debian:latest',
      'ADD https://example.com/x.tar.gz /x',
      'ADD local.txt /x',
      'COPY --from=nowhere /a /b',
      'COPY no-such-file /app/',
      'COPY node_modules /app/node_modules',
      'WORKDIR app',
      'RUN apt-get install -y postfix',
      'RUN curl -fsSL https://example.com/install | sh',
      'USER root',
      'HEALTHCHECK CMD pg_isready',
      'ENTRYPOINT node src/main.ts',
      'CMD api',
    ].join('\n');
    const problems = lintDockerfile(bad, { context: REPO }).join('\n');
    for (const expected of [
      /line 1: FROM node is not pinned/,
      /line 2: npm install without --omit=dev/,
      /line 2: npm install runs install scripts/,
      /line 2: the npm package node is left in node_modules/,
      /line 3: FROM debian:latest is not pinned/,
      /line 4: ADD of a URL/,
      /line 5: ADD instead of COPY/,
      /line 6: COPY --from=nowhere names no earlier stage/,
      /line 7: COPY no-such-file: no such file/,
      /line 8: COPY node_modules is excluded by .dockerignore/,
      /line 9: WORKDIR app is not absolute/,
      /line 10: apt-get install without --no-install-recommends/,
      /line 10: apt-get install without apt-get update/,
      /line 10: apt lists are not removed/,
      /line 11: pipes a download into a shell/,
      /line 12: USER root is root/,
      /line 13: HEALTHCHECK CMD is not in exec form/,
      /line 14: ENTRYPOINT is not in exec form/,
      /line 15: CMD is not in exec form/,
    ]) {
      assert.match(problems, expected);
    }
    assert.deepEqual(lintDockerfile('FROM debian:bookworm-slim\nENTRYPOINT ["sh"]\n', { context: REPO }), [
      'the last stage has no USER: it runs as root',
    ]);
  });

  test('reads continuations, comments inside them, flags and stages', () => {
    const stages = parseDockerfile(
      '# syntax=docker/dockerfile:1\nFROM a:1 AS one\nRUN x \\\n  # a comment\n  && y\nFROM b:2\nCOPY --from=one --chown=1:1 /p /q\n',
    );
    assert.deepEqual(
      stages.map((s) => [s.image, s.name]),
      [
        ['a:1', 'one'],
        ['b:2', undefined],
      ],
    );
    assert.equal(stages[0]?.instructions[1]?.args, 'x && y');
    assert.equal(stages[0]?.instructions[1]?.line, 3);
    assert.deepEqual(stages[1]?.instructions[1]?.flags, { from: 'one', chown: '1:1' });
  });
});

describe('docker/Dockerfile (the service)', () => {
  const stages = parseDockerfile(read(APP));
  const last = stages.at(-1);

  test('passes the lint', () => {
    assert.deepEqual(lintDockerfile(read(APP), { context: REPO }), []);
  });

  test('is multi-stage on Node 24 slim, runs as the unprivileged node user, entry chosen by command', () => {
    assert.deepEqual(
      stages.map((s) => s.image),
      ['node:24-bookworm-slim', 'node:24-bookworm-slim'],
    );
    const of = (keyword: string) => last?.instructions.filter((i) => i.keyword === keyword).at(-1)?.args;
    assert.equal(of('USER'), 'node');
    assert.deepEqual(execForm(of('ENTRYPOINT') ?? ''), ['/app/docker/start/app.sh']);
    assert.deepEqual(execForm(of('CMD') ?? ''), ['api']);
    const app = read(join(START, 'app.sh'));
    assert.match(app, /^ {2}api \| policy \| milter \| lmtp \| jobs \| migrate\)$/m);
    assert.match(app, /exec node src\/main\.ts "\$@"/);
  });

  test('holds the sources, migrations, templates and start scripts, and no test or dev state', () => {
    const { files, fromStages } = imageFiles(stages, REPO);
    for (const path of [
      '/app/package.json',
      '/app/src/main.ts',
      '/app/src/cli/probe.ts',
      '/app/src/cli/inboxctl.ts',
      '/app/postfix/main.cf',
      '/app/docker/start/app.sh',
    ]) {
      assert.ok(files.has(path), path);
    }
    for (const migration of readdirSync(join(REPO, 'migrations'))) {
      assert.ok(files.has(`/app/migrations/${migration}`), migration);
    }
    assert.ok(![...files].some((f) => f.startsWith('/app/test/') || f.startsWith('/app/.run/')));
    assert.deepEqual(
      fromStages,
      ['/app/node_modules'],
      'only the production node_modules from the deps stage',
    );
  });
});

describe('docker/postfix/Dockerfile', () => {
  const stages = parseDockerfile(read(POSTFIX));

  test('passes the lint (running as root, for the reason it states)', () => {
    assert.deepEqual(lintDockerfile(read(POSTFIX), { context: REPO, runsAsRootBecause: ROOT_REASON }), []);
    assert.match(
      read(POSTFIX),
      /It runs as root: Postfix's master binds port 25 and starts its daemons as the `postfix` user/,
    );
  });

  test('is Debian bookworm-slim with Postfix, Node copied from the same release for the renderer', () => {
    assert.deepEqual(
      stages.map((s) => s.image),
      ['node:24-bookworm-slim', 'debian:bookworm-slim'],
    );
    const runs =
      stages
        .at(-1)
        ?.instructions.filter((i) => i.keyword === 'RUN')
        .map((i) => i.args) ?? [];
    assert.ok(runs.some((r) => /apt-get install -y --no-install-recommends postfix\b/.test(r)));
    assert.ok(
      runs.some((r) => /main_mailer_type select No configuration/.test(r)),
      'no Debian main.cf',
    );
    const { files, fromStages } = imageFiles(stages, REPO);
    assert.ok(fromStages.includes('/usr/local/bin/node'));
    for (const path of [
      '/app/src/cli/render-postfix.ts',
      '/app/src/postfix/render.ts',
      '/app/postfix/master.cf',
    ]) {
      assert.ok(files.has(path), path);
    }
    const last = stages.at(-1);
    const healthcheck = last?.instructions.find((i) => i.keyword === 'HEALTHCHECK')?.args ?? '';
    assert.match(healthcheck, /CMD \["\/app\/docker\/start\/postfix-health\.sh"\]$/);
    assert.ok(files.has('/app/docker/start/postfix-health.sh'));
  });
});

describe('the start scripts', () => {
  const scripts = readdirSync(START).filter((f) => f.endsWith('.sh'));

  test('are POSIX sh with set -eu, executable, and parse', async () => {
    assert.deepEqual(scripts.sort(), ['app.sh', 'postfix-health.sh', 'postfix.sh']);
    for (const script of scripts) {
      const path = join(START, script);
      const text = read(path);
      assert.ok(text.startsWith('#!/bin/sh\n'), `${script}: #!/bin/sh`);
      assert.match(text, /^set -eu$/m, `${script}: set -eu`);
      assert.ok((statSync(path).mode & 0o111) === 0o111, `${script} is executable`);
      await run('sh', ['-n', path]); // dash: Debian's /bin/sh, as in the images
      assert.doesNotMatch(
        text,
        /\[\[|\bfunction\b|\$\{[A-Za-z_]+\/\/|<<<|\bsource\b/,
        `${script}: no bashisms`,
      );
    }
  });
});
