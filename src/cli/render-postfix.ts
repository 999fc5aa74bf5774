/**
 * render-postfix - writes one Postfix instance's main.cf and master.cf from the environment, with the
 * renderer `make run` uses (src/postfix/render.ts): the Postfix image's start script runs it
 * (docker/start/postfix.sh).
 *
 *   node src/cli/render-postfix.ts --config-directory DIR --queue-directory DIR
 *                                  --data-directory DIR --maillog-file PATH
 *
 * Reads:     the service's variables (MAIL_DOMAIN, AUTHSERV_ID, SMTP_HOST, SMTP_PORT, POLICY_PORT,
 *            MILTER_PORT, LMTP_PORT, MAX_MESSAGE_BYTES, RESERVATION_TTL_SECONDS; README
 *            "Configuration"), and every variable `POSTCONF_<parameter>` (a lower-case main.cf
 *            parameter name) as an override of that parameter, e.g.
 *            POSTCONF_smtpd_tls_security_level=may; an empty value sets it empty.
 * Writes:    DIR/main.cf and DIR/master.cf (mode 0644, dated two seconds back; instance.ts says why).
 * On error:  exit 78 naming the variable (a bad or missing value; MAIL_DOMAIN is required here even in
 *            dev: an MX for "localhost" is never what a container wants), 64 bad arguments, 1 anything
 *            else (a template left unfilled, a directory that cannot be written).
 */
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { ConfigError, describeListen, loadConfig } from '../config/config.ts';
import { writeConfigFile } from '../postfix/instance.ts';
import { renderPostfix } from '../postfix/render.ts';
import { runCli } from './run-cli.ts';

const USAGE =
  'usage: node src/cli/render-postfix.ts --config-directory DIR --queue-directory DIR --data-directory DIR --maillog-file PATH';

const OVERRIDE = /^POSTCONF_([a-z0-9_]+)$/;

/** Every `POSTCONF_<parameter>` variable, as parameter → value. */
function overridesFrom(env: Record<string, string | undefined>): Record<string, string> {
  const overrides: Record<string, string> = {};
  for (const [name, value] of Object.entries(env)) {
    if (!name.startsWith('POSTCONF_')) continue;
    const match = OVERRIDE.exec(name);
    if (!match?.[1])
      throw new ConfigError(name, 'must be POSTCONF_ followed by a lower-case main.cf parameter name');
    overrides[match[1]] = value ?? '';
  }
  return overrides;
}

async function main(argv: string[]): Promise<number> {
  const option = { type: 'string' } as const;
  let values: Record<string, string | undefined>;
  try {
    values = parseArgs({
      args: argv,
      options: {
        'config-directory': option,
        'queue-directory': option,
        'data-directory': option,
        'maillog-file': option,
      },
    }).values;
  } catch (error) {
    process.stderr.write(`render-postfix: ${(error as Error).message}\n${USAGE}\n`);
    return 64;
  }
  const configDirectory = values['config-directory'];
  const queueDirectory = values['queue-directory'];
  const dataDirectory = values['data-directory'];
  const maillogFile = values['maillog-file'];
  if (!configDirectory || !queueDirectory || !dataDirectory || !maillogFile) {
    process.stderr.write(`${USAGE}\n`);
    return 64;
  }
  if (!process.env.MAIL_DOMAIN) throw new ConfigError('MAIL_DOMAIN', 'is required to render Postfix');
  const config = loadConfig();
  const overrides = overridesFrom(process.env);
  const files = renderPostfix(
    config,
    { configDirectory, queueDirectory, dataDirectory, maillogFile },
    overrides,
  );
  await mkdir(configDirectory, { recursive: true, mode: 0o755 });
  await writeConfigFile(join(configDirectory, 'main.cf'), files.mainCf);
  await writeConfigFile(join(configDirectory, 'master.cf'), files.masterCf);
  process.stdout.write(
    `render-postfix: ${configDirectory}: ${config.mailDomain} via ${config.smtpHost}:${config.smtpPort}, ` +
      `policy ${describeListen(config.policyListen)}, milter ${describeListen(config.milterListen)}, ` +
      `lmtp ${describeListen(config.lmtpListen)}` +
      `${Object.keys(overrides).length > 0 ? `, overrides: ${Object.keys(overrides).sort().join(' ')}` : ''}\n`,
  );
  return 0;
}

runCli('render-postfix', () => main(process.argv.slice(2)));
