# The C library and the Go package (included by the top Makefile).
#   make ffi-lib       build libferrolock.{a,so} and stage them with ferrolock.h and ferrolock.pc
#                      under target/ffi (a prefix usable in place: PKG_CONFIG_PATH=target/ffi/lib/pkgconfig)
#   make check-header  regenerate ffi/include/ferrolock.h and fail if it differs from the commit
#   make test-c        C tests + the examples (hello_lock.c, the README's) against real redis-servers, a valgrind run
#                      and the sanitizer run (test-c-sanitize)
#   make test-c-sanitize  the C tests built with ASan and UBSan (any report fails), against real redis-servers
#   make test-go       go vet, go test, go test -race under GOEXPERIMENT=cgocheck2, over the in-tree library
#                      (CGO_CFLAGS carries the library's checksum: Go's build cache does not see a rebuilt .a)
#   make asan-fork-repro  why fork_child is not in the sanitizer run: children forked among threads hang in ASan
#   make install PREFIX=/usr/local [DESTDIR=...]   a release build into DESTDIR/PREFIX/{lib,include,lib/pkgconfig}
#
# The shared library is staged as libferrolock.so.V (V the workspace version), with the
# soname's link libferrolock.so.ABI -> it and the link-time libferrolock.so -> the soname.
# ABI is 0.y while the version is 0.y.z (a 0.y release may break the ABI), the major from 1.0
# (ffi/build.rs records the same soname).

FFI_STAGE := $(CURDIR)/target/ffi
# Where cargo builds (CARGO_TARGET_DIR when set).
FFI_TARGET := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)
FFI_VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
# The repository URL, from Cargo.toml (scripts/repository.sh; REPO_URL overrides it for make dist).
FFI_URL := $(shell scripts/repository.sh url)
FFI_VERSION_PARTS := $(subst ., ,$(FFI_VERSION))
FFI_ABI := $(if $(filter 0,$(word 1,$(FFI_VERSION_PARTS))),0.$(word 2,$(FFI_VERSION_PARTS)),$(word 1,$(FFI_VERSION_PARTS)))
PREFIX ?= /usr/local
CC ?= cc
FFI_CFLAGS := -std=c11 -Wall -Wextra -Werror -g -O1 -pthread
# pkg-config when the machine has it; otherwise the same flags by hand.
FFI_PC_FLAGS = $(shell if command -v pkg-config >/dev/null 2>&1; then \
	PKG_CONFIG_PATH=$(FFI_STAGE)/lib/pkgconfig pkg-config --cflags --libs ferrolock; else \
	echo "-I$(FFI_STAGE)/include $(FFI_STAGE)/lib/libferrolock.a -lpthread -ldl -lm -lrt -lutil -lgcc_s"; fi)

.PHONY: ffi-lib check-header test-c test-c-sanitize test-go install asan-fork-repro

# $(1): cargo profile flag, $(2): target dir profile name, $(3): the directory staged into
# (the .pc finds its prefix from its own place, so the tree can be moved)
# (FFI_CARGO_BUILD: `cargo zigbuild` for the release tarball)
FFI_CARGO_BUILD = $(CARGO) build
define ffi_stage
	$(FFI_CARGO_BUILD) --locked -p ferrolock-ffi $(1)
	mkdir -p $(3)/lib/pkgconfig $(3)/include
	cp $(FFI_TARGET)/$(2)/libferrolock_ffi.a $(3)/lib/libferrolock.a
	cp $(FFI_TARGET)/$(2)/libferrolock_ffi.so $(3)/lib/libferrolock.so.$(FFI_VERSION)
	ln -sfn libferrolock.so.$(FFI_VERSION) $(3)/lib/libferrolock.so.$(FFI_ABI)
	ln -sfn libferrolock.so.$(FFI_ABI) $(3)/lib/libferrolock.so
	cp ffi/include/ferrolock.h $(3)/include/ferrolock.h
	sed -e 's|@VERSION@|$(FFI_VERSION)|' -e 's|@URL@|$(FFI_URL)|' ffi/ferrolock.pc.in > $(3)/lib/pkgconfig/ferrolock.pc
endef

ffi-lib:
	$(call ffi_stage,,debug,$(FFI_STAGE))

check-header: ffi-lib
	git diff --exit-code -- ffi/include/ferrolock.h || \
	  { echo "ffi/include/ferrolock.h is stale: commit the regenerated header" >&2; exit 1; }

test-c: redis ffi-lib check-header
	mkdir -p target/ffi/bin
	$(CC) $(FFI_CFLAGS) ffi/tests/test_ferrolock.c -o target/ffi/bin/test_ferrolock $(FFI_PC_FLAGS)
	$(CC) $(FFI_CFLAGS) ffi/examples/hello_lock.c -o target/ffi/bin/hello_lock $(FFI_PC_FLAGS)
	sed -n '/^## First example: C$$/,/^## /p' README.md | sed -n '/^```c$$/,/^```$$/{/^```/!p}' > target/ffi/bin/readme_example.c
	$(CC) $(FFI_CFLAGS) target/ffi/bin/readme_example.c -o target/ffi/bin/readme_example $(FFI_PC_FLAGS)
	$(CC) $(FFI_CFLAGS) -I$(FFI_STAGE)/include ffi/tests/test_ferrolock.c -o target/ffi/bin/test_ferrolock_shared \
	  -L$(FFI_STAGE)/lib -lferrolock
	readelf -d target/ffi/bin/test_ferrolock_shared | grep -F '[libferrolock.so.$(FFI_ABI)]'
	FERROLOCK_TEST_NODES=1 LD_LIBRARY_PATH=$(FFI_STAGE)/lib ffi/tests/with-redis.sh target/ffi/bin/test_ferrolock_shared --only version
	timeout 600 ffi/tests/with-redis.sh target/ffi/bin/test_ferrolock
	FERROLOCK_TEST_NODES=1 ffi/tests/with-redis.sh target/ffi/bin/hello_lock
	FERROLOCK_TEST_NODES=1 ffi/tests/with-redis.sh target/ffi/bin/readme_example
	FERROLOCK_TEST_NODES=1 FERROLOCK_TEST_NODE_TIMEOUT_MS=3000 ffi/tests/with-redis.sh valgrind --quiet --error-exitcode=99 --leak-check=full \
	  --errors-for-leak-kinds=definite --show-leak-kinds=definite --track-origins=no \
	  target/ffi/bin/test_ferrolock --only acquire_release,completion_acquire,manager_free_ends_waits,calls_on_a_closed_manager,callbacks_call_back_in,cancel_blocked_acquire,bad_inputs,read_write,\
	rw_semaphore_cancel_start,rw_semaphore_release_all,rw_semaphore_freed_unreleased,rw_semaphore_done_calls_back_in
	$(MAKE) --no-print-directory test-c-sanitize

# Every C test with AddressSanitizer and UndefinedBehaviorSanitizer on the test program (the
# Rust library is not instrumented, but its heap goes through ASan's malloc, so an overrun or a
# use after free of what it hands out, or a double free, is caught). Any report fails the run.
# Leaks are valgrind's part (above): LSan's exit-time check also counts buffers of library
# threads still running at exit, and it cannot be suppressed precisely, as Rust frames carry
# no frame pointers. fork_child, fork_during_done and rw_semaphore_fork_child are left to the plain run
# (--except): each forks a child (no exec) while the library's threads run, and this
# compiler's libasan (GCC 12) does nothing at a fork (no fork interceptor, no atfork handler,
# no ASAN_OPTIONS flag for it), so an allocator mutex a parent thread held at the fork stays
# locked in the child. Seen (load
# average 8-11 on 2 CPUs): the tests up to fork_child under ASan, 9 children hung in 124 runs;
# in each, the child's runtime worker waited in __sanitizer::Mutex::Lock <-
# SizeClassAllocator64::GetFromAllocator <- __asan::Allocator::Allocate <- malloc (a Vec grown
# by redis-rs), its other threads in epoll_wait and a condvar wait, so no thread of the child
# held that mutex and no ferrolock lock was involved. fork_child alone under ASan: 0 hangs in
# 400 (and in 300 more with both CPUs saturated); the plain build: 0 in 400 alone and 0 in 100
# after the other tests (glibc's malloc is fork-safe). Without ferrolock, `make
# asan-fork-repro` (children forked among threads being created) hangs 8 and 15 children of
# 300 under ASan, 0 plain, in the same allocator frame. Upstream: google/sanitizers#774 (ASan
# deadlocks after fork); fixed in LLVM 18 by llvm/llvm-project#75290 ("[asan] Install
# pthread_atfork"), which GCC 12's libasan predates: built with clang >= 18 (apt's clang-19),
# the fork tests could run here again, at the cost of a second toolchain in CI.
FFI_SANITIZE := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
test-c-sanitize: redis ffi-lib
	mkdir -p target/ffi/bin
	$(CC) $(FFI_CFLAGS) $(FFI_SANITIZE) ffi/tests/test_ferrolock.c -o target/ffi/bin/test_ferrolock_sanitize $(FFI_PC_FLAGS)
	ASAN_OPTIONS=detect_leaks=0:halt_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  timeout 600 ffi/tests/with-redis.sh target/ffi/bin/test_ferrolock_sanitize --except fork_child,fork_during_done,rw_semaphore_fork_child

# The evidence for leaving fork_child out of the sanitizer run, without ferrolock: a child
# forked among threads being created hangs in ASan's allocator (exit 1), never in a plain build.
# Run it on a new compiler: when the ASan build stops hanging, the fork tests can go back in.
asan-fork-repro:
	mkdir -p target/ffi/bin
	$(CC) -g -O1 -pthread ffi/tests/asan_fork_repro.c -o target/ffi/bin/asan_fork_repro_plain
	$(CC) -g -O1 -pthread -fsanitize=address -fno-omit-frame-pointer ffi/tests/asan_fork_repro.c -o target/ffi/bin/asan_fork_repro
	target/ffi/bin/asan_fork_repro_plain
	ASAN_OPTIONS=detect_leaks=0 target/ffi/bin/asan_fork_repro || echo "asan-fork-repro: children hang under ASan (fork_child stays out of test-c-sanitize)"

test-go: redis ffi-lib
	cd ffi/go && export PKG_CONFIG_PATH=$(FFI_STAGE)/lib/pkgconfig && \
	  export CGO_CFLAGS="-DFERROLOCK_LIB_SUM=$$(sha256sum $(FFI_STAGE)/lib/libferrolock.a | cut -c1-16)" && \
	  go vet ./... && \
	  timeout 900 ../tests/with-redis.sh go test -count=1 ./... && \
	  GOEXPERIMENT=cgocheck2 timeout 900 ../tests/with-redis.sh go test -count=1 -race ./... && \
	  FERROLOCK_TEST_NODES=1 timeout 300 ../tests/with-redis.sh go run ./examples/withlock

install:
	$(call ffi_stage,--release,release,$(DESTDIR)$(PREFIX))

# The release C tarball's tree (scripts/dist.sh): the same staging as install, for
# FFI_DIST_TARGET (a glibc-versioned triple, x86_64-unknown-linux-gnu.2.17, built with
# FFI_CARGO_BUILD="cargo zigbuild"; its output directory drops the glibc suffix) into FFI_DIST_DIR.
.PHONY: ffi-dist-stage
ffi-dist-stage:
	$(call ffi_stage,--release --target $(FFI_DIST_TARGET),$(firstword $(subst ., ,$(FFI_DIST_TARGET)))/release,$(FFI_DIST_DIR))
	cp LICENSE $(FFI_DIST_DIR)/

## libFuzzer over the C entry points that parse caller input (options by name, node URLs):
## the library built with sanitizer coverage (stable rustc flags, as cargo-fuzz uses), the
## harness with ASan. FUZZ_SECONDS=600 by default. Separate from `make test`.
FUZZ_SECONDS ?= 600
FUZZ_TARGET := $(CURDIR)/target/fuzz
# An explicit --target, so that RUSTFLAGS reach the library and not the build scripts.
FUZZ_TRIPLE := $(shell rustc -vV | sed -n 's/^host: //p')
FUZZ_RUSTFLAGS := -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=3 \
	-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
	-Cllvm-args=-sanitizer-coverage-trace-compares -Cdebug-assertions -Coverflow-checks

.PHONY: fuzz
fuzz:
	@command -v clang >/dev/null 2>&1 || { echo "installing clang (libFuzzer)" >&2; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang libclang-rt-14-dev >/dev/null; }
	RUSTFLAGS="$(FUZZ_RUSTFLAGS)" CARGO_TARGET_DIR=$(FUZZ_TARGET) $(CARGO) build --locked -p ferrolock-ffi --release --target $(FUZZ_TRIPLE)
	mkdir -p target/ffi/bin target/fuzz/corpus
	clang -g -O1 -fsanitize=fuzzer,address -Iffi/include ffi/fuzz/fuzz_entry.c \
	  $(FUZZ_TARGET)/$(FUZZ_TRIPLE)/release/libferrolock_ffi.a -lpthread -ldl -lm -lrt -lutil -lgcc_s -o target/ffi/bin/fuzz_entry
	ASAN_OPTIONS=detect_leaks=1 target/ffi/bin/fuzz_entry -max_total_time=$(FUZZ_SECONDS) -timeout=10 \
	  -artifact_prefix=target/fuzz/ target/fuzz/corpus ffi/fuzz/corpus
