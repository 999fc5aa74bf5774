/**
 * dockerfile - a small Dockerfile reader and linter for the images in docker/ (no hadolint offline).
 *
 * parseDockerfile() understands what these Dockerfiles use: parser directives, comments, line
 * continuations, `--flag=value` options, stages (`FROM image AS name`) and the exec (JSON) form.
 * lintDockerfile() returns one message per problem (empty: clean); imageFiles() lists the files the
 * final stage copies from the build context, by their path inside the image.
 */
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join, posix, relative } from 'node:path';

export interface Instruction {
  keyword: string;
  /** The arguments after the flags, as written. */
  args: string;
  flags: Record<string, string>;
  line: number;
}

export interface Stage {
  image: string;
  name: string | undefined;
  instructions: Instruction[];
}

export function parseDockerfile(text: string): Stage[] {
  const stages: Stage[] = [];
  const lines = text.split('\n');
  let pending = '';
  let startLine = 0;
  for (let i = 0; i < lines.length; i++) {
    const raw = lines[i] ?? '';
    if (/^\s*#/.test(raw)) continue; // comments (and parser directives), also inside continuations
    if (pending === '' && raw.trim() === '') continue;
    if (pending === '') startLine = i + 1;
    if (/\\\s*$/.test(raw)) {
      pending += `${raw.replace(/\\\s*$/, '')} `;
      continue;
    }
    const whole = `${pending}${raw}`.trim();
    pending = '';
    if (whole === '') continue;
    const match = /^(\S+)\s*(.*)$/s.exec(whole);
    const keyword = (match?.[1] ?? '').toUpperCase();
    let rest = match?.[2] ?? '';
    const flags: Record<string, string> = {};
    for (
      let flag = /^--([a-z-]+)(?:=(\S*))?\s+/.exec(rest);
      flag;
      flag = /^--([a-z-]+)(?:=(\S*))?\s+/.exec(rest)
    ) {
      flags[flag[1] ?? ''] = flag[2] ?? '';
      rest = rest.slice(flag[0].length);
    }
    const instruction: Instruction = {
      keyword,
      args: rest.replace(/\s+/g, ' ').trim(),
      flags,
      line: startLine,
    };
    if (keyword === 'FROM') {
      const from = /^(\S+)(?:\s+AS\s+(\S+))?$/i.exec(instruction.args);
      stages.push({ image: from?.[1] ?? '', name: from?.[2], instructions: [instruction] });
    } else {
      const stage = stages.at(-1);
      if (!stage) throw new Error(`line ${startLine}: ${keyword} before the first FROM`);
      stage.instructions.push(instruction);
    }
  }
  return stages;
}

/** The exec form's argument list, or undefined for the shell form. */
export function execForm(args: string): string[] | undefined {
  if (!args.startsWith('[')) return undefined;
  try {
    const list: unknown = JSON.parse(args);
    return Array.isArray(list) && list.every((item) => typeof item === 'string') ? list : undefined;
  } catch {
    return undefined;
  }
}

/** `.dockerignore` patterns (the forms used here: paths, `*`, `**`), as a predicate on context paths. */
export function dockerignore(context: string): (path: string) => boolean {
  const file = join(context, '.dockerignore');
  if (!existsSync(file)) return () => false;
  const patterns = readFileSync(file, 'utf8')
    .split('\n')
    .map((line) => line.trim())
    .filter((line) => line !== '' && !line.startsWith('#'))
    .map((pattern) => {
      const source = pattern
        .replace(/^\/+/, '')
        .replace(/[.+^${}()|[\]\\]/g, '\\$&')
        .replaceAll('**/', '\u0000')
        .replaceAll('*', '[^/]*')
        .replaceAll('\u0000', '(?:.*/)?');
      return new RegExp(`^${source}(?:/.*)?$`);
    });
  return (path) => patterns.some((pattern) => pattern.test(path));
}

const PINNED = /^[a-z0-9./-]+(?::[A-Za-z0-9._-]+)?(?:@sha256:[0-9a-f]{64})?$/;

/** Whether an image reference names a tag other than latest, or a digest. */
export function pinnedImage(reference: string): boolean {
  if (!PINNED.test(reference)) return false;
  if (reference.includes('@sha256:')) return true;
  const tag = /:([A-Za-z0-9._-]+)$/.exec(reference.replace(/^[^/]*:\d+\//, ''))?.[1];
  return tag !== undefined && tag !== 'latest';
}

function walk(path: string): string[] {
  if (!statSync(path).isDirectory()) return [path];
  return readdirSync(path).flatMap((entry) => walk(join(path, entry)));
}

/**
 * The files of the build context the last stage copies (`COPY` without `--from`), by their absolute
 * path in the image; and the paths it copies from other stages, as prefixes.
 */
export function imageFiles(stages: Stage[], context: string): { files: Set<string>; fromStages: string[] } {
  const files = new Set<string>();
  const fromStages: string[] = [];
  const stage = stages.at(-1);
  let workdir = '/';
  for (const instruction of stage?.instructions ?? []) {
    if (instruction.keyword === 'WORKDIR') workdir = posix.resolve(workdir, instruction.args);
    if (instruction.keyword !== 'COPY') continue;
    const parts = execForm(instruction.args) ?? instruction.args.split(' ');
    const destination = posix.resolve(workdir, parts.at(-1) ?? '');
    const sources = parts.slice(0, -1);
    if ('from' in instruction.flags) {
      fromStages.push(destination);
      continue;
    }
    const toDirectory = sources.length > 1 || (parts.at(-1) ?? '').endsWith('/');
    for (const source of sources) {
      const absolute = join(context, source);
      if (!existsSync(absolute)) continue;
      if (statSync(absolute).isDirectory()) {
        for (const file of walk(absolute)) files.add(posix.join(destination, relative(absolute, file)));
      } else {
        files.add(toDirectory ? posix.join(destination, posix.basename(source)) : destination);
      }
    }
  }
  return { files, fromStages };
}

export interface LintOptions {
  /** The build context (the repository root). */
  context: string;
  /** Why this image's last stage runs as root, when it must; otherwise it needs a non-root USER. */
  runsAsRootBecause?: string;
}

/** Every problem found, as `line N: message`; empty when the Dockerfile is clean. */
export function lintDockerfile(text: string, options: LintOptions): string[] {
  const problems: string[] = [];
  const stages = parseDockerfile(text);
  const report = (instruction: Instruction, message: string) =>
    problems.push(`line ${instruction.line}: ${message}`);
  const ignored = dockerignore(options.context);
  const stageNames = new Set<string>();
  if (stages.length === 0) return ['no FROM'];

  for (const stage of stages) {
    const [from] = stage.instructions;
    if (from && !stageNames.has(stage.image) && !pinnedImage(stage.image)) {
      report(from, `FROM ${stage.image} is not pinned to a tag (other than latest) or a digest`);
    }
    for (const instruction of stage.instructions) {
      const { keyword, args } = instruction;
      if (keyword === 'ADD') {
        report(instruction, /(https?|git|ftp):\/\/|git@/.test(args) ? 'ADD of a URL' : 'ADD instead of COPY');
      }
      if (keyword === 'COPY') {
        const parts = execForm(args) ?? args.split(' ');
        const from = instruction.flags.from;
        if (from !== undefined) {
          if (!stageNames.has(from) && !pinnedImage(from)) {
            report(instruction, `COPY --from=${from} names no earlier stage and no pinned image`);
          }
        } else {
          for (const source of parts.slice(0, -1)) {
            const path = relative(options.context, join(options.context, source));
            if (path.startsWith('..')) report(instruction, `COPY ${source} is outside the build context`);
            else if (!existsSync(join(options.context, source)))
              report(instruction, `COPY ${source}: no such file in the build context`);
            else if (ignored(path)) report(instruction, `COPY ${source} is excluded by .dockerignore`);
          }
        }
      }
      if (keyword === 'WORKDIR' && !args.startsWith('/'))
        report(instruction, `WORKDIR ${args} is not absolute`);
      if (['ENTRYPOINT', 'CMD'].includes(keyword) && !execForm(args)) {
        report(instruction, `${keyword} is not in exec form (a JSON array)`);
      }
      if (keyword === 'HEALTHCHECK' && args !== 'NONE' && !execForm(args.replace(/^CMD\s+/, ''))) {
        report(instruction, 'HEALTHCHECK CMD is not in exec form (a JSON array)');
      }
      if (keyword === 'RUN') {
        if (/\bapt-get\s+(-\S+\s+)*install\b/.test(args)) {
          if (!/--no-install-recommends/.test(args))
            report(instruction, 'apt-get install without --no-install-recommends');
          if (!/\bapt-get\s+(-\S+\s+)*update\b/.test(args))
            report(instruction, 'apt-get install without apt-get update in the same RUN');
          if (!/rm -rf \/var\/lib\/apt\/lists/.test(args))
            report(instruction, 'apt lists are not removed in the RUN that installs');
        }
        if (/\b(curl|wget)\b[^|]*\|\s*(ba|da)?sh\b/.test(args))
          report(instruction, 'pipes a download into a shell');
        if (/\bsudo\b/.test(args)) report(instruction, 'uses sudo');
        if (/\bnpm\s+(install|ci|i)\b/.test(args)) {
          if (!/--omit=dev/.test(args)) report(instruction, 'npm install without --omit=dev');
          // The npm package `node` (Node 24 for bare machines) would download a second Node.
          if (!/--ignore-scripts/.test(args)) report(instruction, 'npm install runs install scripts');
          if (!/rm -rf[^&;]*node_modules\/node\b/.test(args))
            report(instruction, 'the npm package node is left in node_modules');
        }
      }
    }
    if (stage.name) stageNames.add(stage.name);
  }

  const last = stages.at(-1) as Stage;
  const user = last.instructions.filter((i) => i.keyword === 'USER').at(-1);
  if (options.runsAsRootBecause === undefined) {
    if (!user) problems.push('the last stage has no USER: it runs as root');
    else if (/^(root|0)(:.*)?$/.test(user.args)) report(user, `USER ${user.args} is root`);
  } else if (user && !/^(root|0)(:.*)?$/.test(user.args)) {
    report(user, `USER ${user.args}, but this image is declared to run as root`);
  }
  const entrypoint = last.instructions.filter((i) => i.keyword === 'ENTRYPOINT').at(-1);
  if (!entrypoint) problems.push('the last stage has no ENTRYPOINT');
  else {
    const program = execForm(entrypoint.args)?.[0] ?? '';
    const { files } = imageFiles(stages, options.context);
    if (program.startsWith('/') && !files.has(program)) {
      report(entrypoint, `ENTRYPOINT ${program} is not copied into the image`);
    }
  }
  return problems;
}
