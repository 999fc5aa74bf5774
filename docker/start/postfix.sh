#!/bin/sh
# postfix.sh - the Postfix image's entry point (docker/postfix/Dockerfile):
#
#   postfix.sh           render the configuration, check it, run the master in the foreground
#   postfix.sh render    render and check only (the tests run this natively: test/docker/)
#
# Renders main.cf and master.cf from postfix/ with src/cli/render-postfix.ts, the renderer `make run`
# uses, from the service's variables (MAIL_DOMAIN, SMTP_HOST, SMTP_PORT, POLICY_PORT, MILTER_PORT,
# LMTP_PORT, AUTHSERV_ID, MAX_MESSAGE_BYTES, RESERVATION_TTL_SECONDS) and POSTCONF_<parameter>
# overrides. `postfix check` then creates what is missing in the queue (a fresh volume) and fails on
# a configuration Postfix refuses. `postfix start-fg` runs the master as this container's PID 1 (`master -i`): docker stop's
# SIGTERM stops Postfix, and mail in the queue volume waits for the next start.
#
# Where the instance lives (defaults: the Debian layout of the image; maillog to the container's log):
#   POSTFIX_CONFIG_DIRECTORY  /etc/postfix      POSTFIX_QUEUE_DIRECTORY  /var/spool/postfix
#   POSTFIX_DATA_DIRECTORY    /var/lib/postfix  POSTFIX_MAILLOG_FILE     /dev/stdout
set -eu

app=$(CDPATH='' cd -- "$(dirname -- "$0")/../.." && pwd)
config_directory=${POSTFIX_CONFIG_DIRECTORY:-/etc/postfix}
queue_directory=${POSTFIX_QUEUE_DIRECTORY:-/var/spool/postfix}
data_directory=${POSTFIX_DATA_DIRECTORY:-/var/lib/postfix}
maillog_file=${POSTFIX_MAILLOG_FILE:-/dev/stdout}

node "$app/src/cli/render-postfix.ts" \
  --config-directory "$config_directory" \
  --queue-directory "$queue_directory" \
  --data-directory "$data_directory" \
  --maillog-file "$maillog_file"

mkdir -p "$queue_directory" # the data directory is created by postfix check, owned by postfix
# With maillog_file set, Postfix's own complaints go to the maillog, not to the terminal.
if ! postfix -c "$config_directory" check; then
  echo "postfix.sh: postfix check failed for $config_directory" >&2
  if [ -f "$maillog_file" ]; then tail -n 20 "$maillog_file" >&2; fi
  exit 1
fi

if [ "${1:-}" = render ]; then exit 0; fi
exec postfix -c "$config_directory" start-fg
