# ferrolock: `make demo`, `make test`, `make bench`. Every target installs what it needs.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: test demo bench redis lint test-rust fmt clippy

redis:
	@scripts/ensure-redis.sh

## Everything CI checks: formatting, lints, and every test suite against real redis-servers.
test: redis lint test-rust

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

test-rust: redis
	$(CARGO) test

## Several `ferrolock run` processes contending for one key, on a redis-server of its own.
demo: redis
	@scripts/demo.sh

bench: redis
	@bench/run.sh

fmt:
	$(CARGO) fmt --all
