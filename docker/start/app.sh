#!/bin/sh
# app.sh - the service image's entry point (docker/Dockerfile):
#
#   app.sh api | policy | milter | lmtp | jobs | migrate     the entry of src/main.ts to run
#   app.sh inboxctl ARGS...                                  the operator CLI
#   app.sh COMMAND ARGS...                                   anything else, as given (e.g. sh)
#
# An entry first waits for the database (probe, up to WAIT_FOR_DATABASE_SECONDS, default 60; a
# configuration error exits 78 at once), then replaces this shell with `node src/main.ts ENTRY`, so the
# daemon itself receives docker stop's SIGTERM. `migrate` applies pending migrations and exits; the
# daemons never migrate (the compose file runs the one-shot migrate service before them).
# `all` is refused: it runs a Postfix inside the process's host, which this image does not have.
set -eu

app=$(CDPATH='' cd -- "$(dirname -- "$0")/../.." && pwd)
cd "$app"

case "${1:-}" in
  api | policy | milter | lmtp | jobs | migrate)
    node src/cli/probe.ts --wait "${WAIT_FOR_DATABASE_SECONDS:-60}" database
    exec node src/main.ts "$@"
    ;;
  all)
    echo "app.sh: 'all' needs Postfix on the same host: run the compose stack (make up) or make run" >&2
    exit 64
    ;;
  inboxctl)
    shift
    exec node src/cli/inboxctl.ts "$@"
    ;;
  '')
    echo "usage: app.sh api|policy|milter|lmtp|jobs|migrate, app.sh inboxctl ARGS, or any command" >&2
    exit 64
    ;;
  *)
    exec "$@"
    ;;
esac
