# ferrolock: `make demo`, `make test`, `make bench`. Every target installs what it needs.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: test demo bench redis lint test-rust test-python test-node test-interop test-faults chaos fmt dist dist-smoke

include ffi/ffi.mk

redis:
	@scripts/ensure-redis.sh

## Everything CI checks: formatting, lints, and every test suite against real redis-servers.
test: redis lint test-rust test-python test-node test-interop test-faults test-c test-go

## The version is the same everywhere it is written (scripts/check-version.sh: reads files only),
## and the Go module path is the one Cargo.toml's repository URL gives (scripts/repository.sh);
## the npm package as released passes publint and @arethetypeswrong (scripts/dist-node.sh --lint:
## the JavaScript package alone, packed in seconds; the tools go to .dist-venv/npm).
lint:
	scripts/check-version.sh
	scripts/repository.sh check
	scripts/dist-node.sh --lint
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

test-rust: redis
	$(CARGO) test --locked

## The Python package: built into .venv, stubs checked, pytest against real redis-servers.
test-python: redis
	FERROLOCK_DEBUG_BUILD=1 python/test.sh

## The Node package: `npm install` in node/ (@napi-rs/cli, typescript, ioredis and node-redlock),
## `npm run build` (the addon from source, a debug build in target/debug beside the other dev builds), then
## `node --test` against real redis-servers.
test-node: redis
	cd node && npm install --no-audit --no-fund && FERROLOCK_DEBUG_BUILD=1 npm run build
	cd node && npm test

## Python, Node and the CLI on one read-write lock, Python and Node on one semaphore: each sees
## the others' holds; random mixes never overlap a writer with anyone, nor exceed the permits.
test-interop: redis
	FERROLOCK_DEBUG_BUILD=1 tests/interop/run.sh

## Safety under real faults: scenarios K1-K11 and a seeded ~60 s chaos run, checked (tests/faults).
test-faults: redis
	FERROLOCK_DEBUG_BUILD=1 tests/faults/run.sh

## The long randomized run: `make chaos DURATION=10m SEED=7` (a seed replays its schedule;
## without one a random seed is drawn and printed). Writes a markdown report.
DURATION ?= 10m
chaos: redis
	tests/faults/run.sh chaos --duration $(DURATION) $(if $(SEED),--seed $(SEED)) $(if $(OUT),--out $(OUT))

## A Python worker and `ferrolock run`s sharing one key on a redis-server of its own, with
## `ferrolock inspect` showing the holder and `ferrolock run --stats` the counts.
demo: redis
	@scripts/demo.sh

bench: redis
	@bench/run.sh

## Release artifacts into dist/ (scripts/dist.sh: wheel + sdist, C tarball for glibc 2.17, static
## musl CLI, npm main + linux-x64-gnu packages, SHA256SUMS), each checked by its ecosystem's lints.
## Refuses while the repository URL is example.invalid (scripts/repository.sh; REPO_URL=https://...
## for a test run). Slow (release builds): not part of `make test`.
dist:
	scripts/dist.sh

## Installs each artifact of dist/ with no Rust reachable (env -i) and takes a lock with it on a
## redis-server of its own (scripts/dist-smoke.sh). Not part of `make test`.
dist-smoke: redis
	scripts/dist-smoke.sh

fmt:
	$(CARGO) fmt --all
