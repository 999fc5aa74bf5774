/**
 * The Makefile's container-stack targets (up, down, logs, ps): documented and phony, and without a
 * Docker engine `make up` stops with one line that says so and points to `make run`. A stand-in
 * `docker` on the PATH plays the engine's part.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { chmod, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { REPO } from './compose-file.ts';

const MAKEFILE = readFileSync(join(REPO, 'Makefile'), 'utf8');
const TARGETS = ['up', 'down', 'logs', 'ps'];

let bin: string;
before(async () => {
  bin = await mkdtemp(join(tmpdir(), 'make-docker-'));
});
after(() => rm(bin, { recursive: true, force: true }));

/** A `docker` that records its arguments, answers `info` and `compose version` as told. */
async function fakeDocker(dir: string, engine: boolean, plugin: boolean): Promise<string> {
  await rm(dir, { recursive: true, force: true });
  await mkdir(dir, { recursive: true });
  const log = join(dir, 'calls');
  await writeFile(
    join(dir, 'docker'),
    [
      '#!/bin/sh',
      `echo "$*" >> ${log}`,
      'case "$1 $2" in',
      `  "info "*) ${engine ? 'echo 28.2.2' : 'echo "Cannot connect to the Docker daemon" >&2; exit 1'} ;;`,
      `  "compose version") ${plugin ? 'echo 2.39.1' : 'echo "unknown command: docker compose" >&2; exit 1'} ;;`,
      'esac',
      '',
    ].join('\n'),
  );
  await chmod(join(dir, 'docker'), 0o755);
  return log;
}

function make(target: string, path: string): Promise<{ code: number; output: string }> {
  return new Promise((resolve) => {
    execFile(
      'make',
      ['--no-print-directory', target],
      { cwd: REPO, env: { PATH: path, HOME: bin } },
      (error, stdout, stderr) => {
        resolve({ code: error ? Number(error.code) : 0, output: `${stdout}${stderr}` });
      },
    );
  });
}

const lines = (text: string) => text.split('\n').filter((line) => line.trim() !== '');

describe('make up, down, logs, ps', () => {
  test('are phony and documented with ## comments', () => {
    const phony =
      MAKEFILE.match(/^\.PHONY:((?:.*\\\n)*.*)$/m)?.[1]
        ?.replace(/\\\n/g, ' ')
        .split(/\s+/) ?? [];
    for (const target of TARGETS) {
      assert.ok(phony.includes(target), `${target} is .PHONY`);
      assert.match(MAKEFILE, new RegExp(`^## ${target}: \\S`, 'm'), `## ${target}: documents it`);
      assert.match(
        MAKEFILE,
        new RegExp(`^${target}:\\n\\t\\$\\(require-stack\\)\\n\\t\\$\\(COMPOSE\\) ${target}\\b`, 'm'),
      );
    }
    assert.match(MAKEFILE, /^COMPOSE := docker compose -f docker\/compose\.yaml /m);
    assert.match(MAKEFILE, /^\t\$\(COMPOSE\) up -d --build$/m);
  });

  test('without docker installed, make up says so in one line, points to make run, and fails', async () => {
    const empty = join(bin, 'none');
    await fakeDocker(empty, false, false);
    await rm(join(empty, 'docker'));
    const result = await make('up', `${empty}:/usr/bin:/bin`);
    assert.notEqual(result.code, 0);
    assert.equal(lines(result.output).length, 1, result.output);
    assert.match(result.output, /no Docker engine answers here .*make run/);
  });

  test('with a client but no engine, every stack target says so in one line and runs nothing else', async () => {
    const dir = join(bin, 'no-engine');
    const log = await fakeDocker(dir, false, true);
    for (const target of TARGETS) {
      const result = await make(target, `${dir}:/usr/bin:/bin`);
      assert.notEqual(result.code, 0, target);
      assert.deepEqual(lines(result.output).length, 1, result.output);
      assert.match(result.output, /no Docker engine answers here \(docker info fails\).*make run/);
    }
    assert.ok(
      lines(await readFile(log, 'utf8')).every((call) => call.startsWith('info')),
      'only docker info ran',
    );
  });

  test('with an engine but no compose plugin, it says that instead', async () => {
    const dir = join(bin, 'no-plugin');
    await fakeDocker(dir, true, false);
    const result = await make('up', `${dir}:/usr/bin:/bin`);
    assert.notEqual(result.code, 0);
    assert.equal(lines(result.output).length, 1, result.output);
    assert.match(result.output, /the docker compose plugin is missing/);
  });

  test('with an engine and the plugin, it needs docker/.env, then builds and starts the stack', async () => {
    const dir = join(bin, 'engine');
    const log = await fakeDocker(dir, true, true);
    const result = await make('up', `${dir}:/usr/bin:/bin`);
    if (existsSync(join(REPO, 'docker', '.env'))) {
      assert.equal(result.code, 0, result.output);
      const calls = lines(await readFile(log, 'utf8'));
      assert.ok(
        calls.some((call) => /^compose -f docker\/compose\.yaml (-f \S+ )?up -d --build$/.test(call)),
        calls.join('\n'),
      );
    } else {
      assert.notEqual(result.code, 0);
      assert.equal(lines(result.output).length, 1, result.output);
      assert.match(result.output, /docker\/\.env is missing: cp docker\/\.env\.example docker\/\.env/);
      assert.ok(
        !lines(await readFile(log, 'utf8')).some((call) => call.includes(' up ')),
        'nothing was started',
      );
    }
  });
});
