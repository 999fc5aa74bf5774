# The two commands of the README's quick start are `make run` and `make test`; everything they need
# (Node 24 from the npm registry, the npm packages, a running PostgreSQL) is brought in here.

SHELL := /bin/bash
# /usr/sbin too: postconf, postfix and dnsmasq live there, and a shell from plain `su` lacks it.
export PATH := $(CURDIR)/node_modules/.bin:$(PATH):/usr/sbin:/sbin
NODE := $(CURDIR)/node_modules/.bin/node
TEST_FILES ?= test/**/*.test.ts

.PHONY: run test check lint typecheck install postgres mail-tools bench-tools database migrate bench-api bench-mail soak clean \
	up down logs ps

## run: start the whole stack in the foreground: API, policy daemon, milter, LMTP receiver and a
## private Postfix on 127.0.0.1:$$SMTP_PORT (default 2525); Ctrl-C stops everything
run: install database mail-tools
	$(NODE) src/main.ts all

## test: lint, type-check and run every test against the local PostgreSQL. A test or hook that hangs
## fails after 5 minutes. (Not --test-force-exit: a file's process then exits before its results are
## all written, and Node counts the lost tests as neither passed nor failed; 12 went missing so.)
test: install postgres mail-tools check
	$(NODE) --test --test-global-setup=test/support/global-setup.ts --test-concurrency=4 \
		--test-timeout=300000 '$(TEST_FILES)'

check: lint typecheck

lint: install
	biome check .

typecheck: install
	tsc --noEmit

## install: Node 24 and the npm packages, from the npm registry (needs only some npm on the PATH)
install: node_modules/.installed

node_modules/.installed: package.json package-lock.json
	@# Exactly the lockfile's versions (npm install could drift from it, and rewrote it).
	npm ci --no-audit --no-fund
	@$(NODE) --version | grep -q '^v24\.' || { echo "node_modules/.bin/node is not Node 24"; exit 1; }
	@touch $@

## postgres: start the local PostgreSQL cluster if it is stopped (skipped when the server to use is
## named: DATABASE_URL for the service, TEST_DATABASE_ADMIN_URL for the tests)
SERVER_URL_VARIABLE = DATABASE_URL
test: SERVER_URL_VARIABLE = TEST_DATABASE_ADMIN_URL
postgres:
	@if [ -n "$($(SERVER_URL_VARIABLE))" ]; then exit 0; fi; \
	if pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then exit 0; fi; \
	if ! command -v pg_ctlcluster >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing PostgreSQL from Debian's packages"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; \
	    hba=$$(ls -d /etc/postgresql/*/main | sort -V | tail -1)/pg_hba.conf; \
	    sed -i '1i host all postgres 127.0.0.1/32 trust  # added by the inbox service'"'"'s make: dev only' "$$hba"; \
	    echo "dev: $$hba lets postgres in on 127.0.0.1 without a password (the default DATABASE_URL)"; \
	  else \
	    echo "PostgreSQL is not running on 127.0.0.1:5432: install it (apt-get install postgresql) or set $(SERVER_URL_VARIABLE)"; exit 1; \
	  fi; \
	fi; \
	version=$$(ls /etc/postgresql | sort -V | tail -1); \
	echo "starting PostgreSQL $$version"; \
	pg_ctlcluster --skip-systemctl-redirect $$version main start || true; \
	pg_ctlcluster --skip-systemctl-redirect $$version main reload 2>/dev/null || true; \
	for i in $$(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && exit 0; sleep 1; done; \
	echo "PostgreSQL did not come up on 127.0.0.1:5432"; exit 1

## mail-tools: Postfix (our private instance), dnsmasq (the tests' DNS) and swaks (the tests' SMTP
## client), from Debian's packages when missing; bench-tools adds postgrey (bench-mail's yardstick, whose
## package starts a system postgrey on port 10023 where services start on install). Postfix is preseeded
## to "No configuration" so the package never starts a system Postfix on port 25.
MAIL_PACKAGES := /usr/sbin/postfix:postfix /usr/sbin/dnsmasq:dnsmasq-base /usr/bin/swaks:swaks
BENCH_PACKAGES := $(MAIL_PACKAGES) /usr/sbin/postgrey:postgrey
mail-tools: PACKAGES = $(MAIL_PACKAGES)
bench-tools: PACKAGES = $(BENCH_PACKAGES)
mail-tools bench-tools:
	@missing=""; for pair in $(PACKAGES); do [ -x "$${pair%%:*}" ] || missing="$$missing $${pair##*:}"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
	  echo "missing Debian packages:$$missing — run as root: apt-get install$$missing"; exit 1; \
	fi; \
	echo "installing from Debian's packages:$$missing"; \
	echo "postfix postfix/main_mailer_type select No configuration" | debconf-set-selections; \
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null

database: install postgres
	$(NODE) src/cli/ensure-database.ts

migrate: database
	$(NODE) src/main.ts migrate

## bench-api: load 1,000 inboxes of 20 messages and measure poll, status and download (see README)
bench-api: install database
	$(NODE) test/bench/api-bench.ts

## bench-mail: messages/s through the real stack vs. Postfix delivering to a null LMTP sink, the policy
## daemon vs. postgrey, the receiver's memory with ten 25 MiB messages at once, what storing a MiB
## costs PostgreSQL, and the milter's content check alone (see README)
bench-mail: install database bench-tools
	$(NODE) test/bench/mail-bench.ts
	$(NODE) test/bench/policy-bench.ts
	$(NODE) test/bench/lmtp-memory.ts
	$(NODE) test/bench/chunk-storage.ts
	$(NODE) test/bench/milter-check-bench.ts

## soak: mail through the real stack for 90 s while its daemons are killed and frozen and PostgreSQL is
## cut off at random; then every accepted message must be stored once, byte for byte, nothing bounced
## and nothing left reserved (test/soak/crash-soak.ts; SOAK_SECONDS, SOAK_RATE, SOAK_FAULTS, SOAK_QUOTA, SOAK_SEED)
soak: install database mail-tools
	$(NODE) test/soak/crash-soak.ts

## up: build the images and start the container stack in the background (docker/compose.yaml; settings
## in docker/.env, from docker/.env.example; see docker/README.md)
up:
	$(require-stack)
	$(COMPOSE) up -d --build

## down: stop and remove the stack's containers (the database and the mail queue stay in their volumes)
down:
	$(require-stack)
	$(COMPOSE) down

## logs: follow the stack's logs (the daemons' JSON lines and Postfix's maillog)
logs:
	$(require-stack)
	$(COMPOSE) logs -f --tail=100

## ps: the stack's containers and their health, the exited ones (migrate) too
ps:
	$(require-stack)
	$(COMPOSE) ps -a

# docker/compose.override.yaml, when present, holds this host's additions (docker/README.md).
COMPOSE := docker compose -f docker/compose.yaml $(if $(wildcard docker/compose.override.yaml),-f docker/compose.override.yaml)
# Expanded when one of the stack's targets runs: without an engine (or the compose plugin, or the env
# file) make stops with one line saying why, before running anything.
define require-stack
$(if $(shell docker info --format '{{.ServerVersion}}' 2>/dev/null),,$(error no Docker engine answers here (docker info fails), so the container stack cannot run; run the service without containers: make run))
$(if $(shell docker compose version --short 2>/dev/null),,$(error the docker compose plugin is missing (docker compose version fails): install it, or run the service without containers: make run))
$(if $(wildcard docker/.env),,$(error docker/.env is missing: cp docker/.env.example docker/.env and set MAIL_DOMAIN, SECRET_KEY and POSTGRES_PASSWORD))
endef

clean:
	rm -rf node_modules .run
