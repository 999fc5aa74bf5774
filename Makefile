# The two commands of the README's quick start are `make run` and `make test`; everything they need
# (Node 24 from the npm registry, the npm packages, a running PostgreSQL) is brought in here.

SHELL := /bin/bash
export PATH := $(CURDIR)/node_modules/.bin:$(PATH)
NODE := $(CURDIR)/node_modules/.bin/node
TEST_FILES ?= test/**/*.test.ts

.PHONY: run test check lint typecheck install postgres database migrate bench-api clean

## run: start the service in the foreground (Ctrl-C stops it)
run: install database
	$(NODE) src/main.ts all

## test: lint, type-check and run every test against the local PostgreSQL
test: install postgres check
	$(NODE) --test --test-global-setup=test/support/global-setup.ts --test-concurrency=4 '$(TEST_FILES)'

check: lint typecheck

lint: install
	biome check .

typecheck: install
	tsc --noEmit

## install: Node 24 and the npm packages, from the npm registry (needs only some npm on the PATH)
install: node_modules/.installed

node_modules/.installed: package.json package-lock.json
	@# npm ci refuses this lockfile: npm leaves other platforms' optional biome binaries out of it.
	npm install --no-audit --no-fund
	@$(NODE) --version | grep -q '^v24\.' || { echo "node_modules/.bin/node is not Node 24"; exit 1; }
	@touch $@

## postgres: start the local PostgreSQL cluster if it is stopped (skipped when DATABASE_URL is set)
postgres:
	@if [ -n "$$DATABASE_URL" ]; then exit 0; fi; \
	if pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then exit 0; fi; \
	if ! command -v pg_ctlcluster >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing PostgreSQL from Debian's packages"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; \
	  else \
	    echo "PostgreSQL is not running on 127.0.0.1:5432: install it (apt-get install postgresql) or set DATABASE_URL"; exit 1; \
	  fi; \
	fi; \
	version=$$(ls /etc/postgresql | sort -V | tail -1); \
	echo "starting PostgreSQL $$version"; \
	pg_ctlcluster --skip-systemctl-redirect $$version main start || true; \
	for i in $$(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && exit 0; sleep 1; done; \
	echo "PostgreSQL did not come up on 127.0.0.1:5432"; exit 1

database: install postgres
	$(NODE) src/cli/ensure-database.ts

migrate: database
	$(NODE) src/main.ts migrate

## bench-api: load 1,000 inboxes of 20 messages and measure poll, status and download (see README)
bench-api: install database
	$(NODE) test/bench/api-bench.ts

clean:
	rm -rf node_modules .run
