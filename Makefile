# ferrolock: `make demo`, `make test`, `make bench`. Every target installs what it needs.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: test demo bench redis lint test-rust test-python fmt

include ffi/ffi.mk

redis:
	@scripts/ensure-redis.sh

## Everything CI checks: formatting, lints, and every test suite against real redis-servers.
test: redis lint test-rust test-python test-c test-go

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

test-rust: redis
	$(CARGO) test --locked

## The Python package: built into .venv, stubs checked, pytest against real redis-servers.
test-python: redis
	python/test.sh

## Several `ferrolock run` processes contending for one key, on a redis-server of its own.
demo: redis
	@scripts/demo.sh

bench: redis
	@bench/run.sh

fmt:
	$(CARGO) fmt --all
