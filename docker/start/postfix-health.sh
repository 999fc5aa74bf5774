#!/bin/sh
# postfix-health.sh - the Postfix container's health check: healthy while a master holds its pid
# file's lock (`master -t` exits 0 when none does) and something listens on SMTP_PORT (25), read from
# /proc/net/tcp and tcp6 (a master that could not bind its port, or whose smtp service is gone, is
# not healthy). Silent: it opens no SMTP session, so it neither asks the policy daemon nor writes to
# the maillog every interval. It does not check that the daemons behind Postfix answer: theirs are
# their own containers' health checks.
set -eu
config_directory=${POSTFIX_CONFIG_DIRECTORY:-/etc/postfix}
port=${SMTP_PORT:-25}
daemon_directory=$(postconf -c "$config_directory" -h daemon_directory)
if "$daemon_directory/master" -c "$config_directory" -t 2>/dev/null; then
  echo "postfix-health: no Postfix master runs for $config_directory" >&2
  exit 1
fi
# A listening socket's line: "N: LOCAL_ADDRESS:PORT REMOTE:0000 0A ..." (hex; 0A is LISTEN).
hex=$(printf '%04X' "$port")
if ! grep -q "^ *[0-9]*: [0-9A-F]*:$hex [0-9A-F]*:0000 0A " /proc/net/tcp /proc/net/tcp6 2>/dev/null; then
  echo "postfix-health: nothing listens on port $port" >&2
  exit 1
fi
