#!/bin/sh
# postfix-health.sh - the Postfix container's health check: healthy while a master holds its pid
# file's lock (`master -t` exits 0 when none does). Silent: it opens no SMTP session, so it neither
# asks the policy daemon nor writes to the maillog every interval.
set -eu
config_directory=${POSTFIX_CONFIG_DIRECTORY:-/etc/postfix}
daemon_directory=$(postconf -c "$config_directory" -h daemon_directory)
if "$daemon_directory/master" -c "$config_directory" -t 2>/dev/null; then
  echo "postfix-health: no Postfix master runs for $config_directory" >&2
  exit 1
fi
