#!/usr/bin/env bash
# `make bench`: every benchmark, merged into bench/results/latest.md.
#
#   1. ferrolock-bench (Rust, release build): uncontended acquire+release vs the redis-rs floor,
#      sleeps per blocking acquire+release with reply polling on vs off (FERROLOCK_SPIN_US=0),
#      the watchdog's cost for 10,000 held locks (issue 4), 4 processes contending for one key
#      (issue 5; on 3 nodes also with one node paused, issue 13), and both again on a 3-primary
#      Redis Cluster beside one server (issue 19). It starts its own redis-servers.
#   2. bench/python/bench_peers.py (issue 6): the Python package vs redis-py Lock, pottery and
#      python-redis-lock, uncontended and contended, on redis-servers it starts itself. Runs in
#      a venv of its own (.bench-venv, created and updated here; FERROLOCK_BENCH_VENV moves it).
#   3. bench/node/bench_node.js (issues 15 and 32): the Node package (built in release by
#      `npm install` in node/) vs node-redlock and hand-written ioredis, C = 1, 16, 64, 256
#      concurrent loops on keys of their own, 1 and 5 nodes, pinned and unpinned, with the
#      JavaScript thread's CPU per lock, on redis-servers it starts itself; the peers live in
#      bench/node's own node_modules; then 4 processes contending for one key vs node-redlock,
#      1 and 3 nodes. Writes bench/results/node-{uncontended,contended}.md (the report gets a
#      summary line) and node.svg (ops/s against C per library; its contended panel also
#      shows Python ferrolock's worst wait, from this run's Python part or else from
#      bench/results/latest.md, and the C and Go figures of part 4, which runs before it, or
#      else of bench/results/go.md). `--node-args --quick`: few short rounds, to see the
#      direction of a change on a busy machine.
#   4. bench/go (issue 16): the Go package (`ffi/go`) vs redsync and hand-written go-redis,
#      uncontended, 1 and 5 nodes, pinned and unpinned, and 4 processes contending for one key
#      vs redsync, 1 and 3 nodes; and C: bench/c/blocking_loop.c through the C library vs the
#      same loop over the core's blocking path (bench/examples/blocking_loop.rs). The C
#      library is built in release and staged into a temp prefix (`make install
#      PREFIX=<tmp>`); the Go module (bench/go, its own go.mod: ffi/go stays standard library
#      only) fetches redsync and go-redis through the Go proxy. Writes the full tables to
#      bench/results/go.md and a summary into the report; with --go-only the summary replaces
#      the Go section of the existing bench/results/latest.md, the rest staying as it was
#      (--node-only does the same with the Node section).
#   5. ferrolock-bench --scenario rw (issue 33): read-mostly (4 processes, 90 % reads, 1 ms
#      sections) on ferrolock's read-write lock vs its exclusive lock vs Redisson 4.7.0's
#      RReadWriteLock, and a semaphore of 4 permits with 8 processes vs Redisson's
#      RPermitExpirableSemaphore, interleaved in rounds on one redis-server. The Redisson side
#      is tests/redisson's Bench class (one JVM per process), built here with
#      `mvn -q -B -o package` (offline: the local Maven repository must hold Redisson, as for
#      the interop tests; FERROLOCK_REDISSON_CP skips the build). Writes the full tables to
#      bench/results/rw-semaphore.md and a summary into the report; --rw-only merges it as
#      --go-only does. `--rw-args "--runs 3 --duration 3"` sets its rounds and their length.
#
# Usage:
#   bench/run.sh                                  # everything (about 2-3 minutes)
#   bench/run.sh --rust-only [ARGS...]            # only the Rust scenarios
#   bench/run.sh --python-only                    # only the Python comparison
#   bench/run.sh --node-only [--node-args "..."]  # only the Node comparison (--node-args --quick)
#   bench/run.sh --go-only [--go-args "..."]      # only the Go and C comparison
#   bench/run.sh --rw-only [--rw-args "..."]      # only the read-write lock and semaphore part
#   bench/run.sh --python-args "--parts contended --duration 2" ...
#   bench/run.sh --out FILE                       # write the report elsewhere (`-`: nowhere)
# Other arguments go to ferrolock-bench, e.g. `bench/run.sh --scenario watchdog --nodes 3`;
# `bench/run.sh --help` lists them, bench_peers.py's and bench/go's.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

command_line="bench/run.sh"
[ $# -eq 0 ] || command_line+="$(printf ' %q' "$@")"
rust=1
python=1
node=1
go=1
rw=1
rw_args=()
go_args=()
python_args=()
node_args=()
rust_args=()
out="$root/bench/results/latest.md"
while [ $# -gt 0 ]; do
    case "$1" in
        --rust-only) python=0; node=0; go=0; rw=0 ;;
        --python-only) rust=0; node=0; go=0; rw=0 ;;
        --node-only) rust=0; python=0; go=0; rw=0 ;;
        --go-only) rust=0; python=0; node=0; rw=0 ;;
        --rw-only) rust=0; python=0; node=0; go=0 ;;
        --rw-args)
            [ $# -ge 2 ] || { echo "bench/run.sh: --rw-args needs a value" >&2; exit 2; }
            read -r -a more <<<"$2"
            rw_args+=("${more[@]}")
            shift
            ;;
        --go-args)
            [ $# -ge 2 ] || { echo "bench/run.sh: --go-args needs a value" >&2; exit 2; }
            read -r -a more <<<"$2"
            go_args+=("${more[@]}")
            shift
            ;;
        --node-args)
            [ $# -ge 2 ] || { echo "bench/run.sh: --node-args needs a value" >&2; exit 2; }
            read -r -a more <<<"$2"
            node_args+=("${more[@]}")
            shift
            ;;
        --python-args)
            [ $# -ge 2 ] || { echo "bench/run.sh: --python-args needs a value" >&2; exit 2; }
            read -r -a more <<<"$2"
            python_args+=("${more[@]}")
            shift
            ;;
        --out)
            [ $# -ge 2 ] || { echo "bench/run.sh: --out needs a value" >&2; exit 2; }
            out="$2"
            shift
            ;;
        -h | --help)
            sed -n '2,53p' "$0" | sed 's/^# \{0,1\}//'
            echo
            echo "ferrolock-bench arguments:"
            "${CARGO:-cargo}" run -q --release -p ferrolock-bench -- --help
            echo
            echo "bench_peers.py arguments (through --python-args):"
            "${FERROLOCK_BENCH_VENV:-$root/.bench-venv}/bin/python" \
                "$root/bench/python/bench_peers.py" --help 2>/dev/null \
                || echo "  (needs the bench venv: run bench/run.sh --python-only once)"
            echo
            echo "bench_node.js arguments (through --node-args):"
            node "$root/bench/node/bench_node.js" --help
            echo
            echo "bench/go arguments (through --go-args):"
            sed -n '/^\/\/ Usage:/,/^package/p' "$root/bench/go/main.go" | sed '$d; s|^// \{0,1\}||'
            exit 0
            ;;
        *) rust_args+=("$1") ;;
    esac
    shift
done
if [ "$rust" = 0 ] && [ "$python" = 0 ] && [ "$node" = 0 ] && [ "$go" = 0 ] && [ "$rw" = 0 ]; then
    echo "bench/run.sh: --rust-only, --python-only, --node-only, --go-only and --rw-only exclude each other" >&2
    exit 2
fi

command -v redis-server >/dev/null || "$root/scripts/ensure-redis.sh"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
started=$SECONDS

# The bench venv: ferrolock from ./python (rebuilt when its sources change) and the peers,
# pinned so that runs compare.
ensure_venv() {
    local venv="${FERROLOCK_BENCH_VENV:-$root/.bench-venv}"
    local quiet=(-q --disable-pip-version-check)
    if [ ! -x "$venv/bin/python" ]; then
        echo "bench/run.sh: creating $venv" >&2
        "${PYTHON:-python3}" -m venv "$venv"
    fi
    py="$venv/bin/python"
    if ! "$py" -c 'import redis, pottery, redis_lock' 2>/dev/null; then
        "$py" -m pip install "${quiet[@]}" "redis==7.4.1" "pottery==3.0.1" "python-redis-lock==4.0.1"
    fi
    local stamp="$venv/.ferrolock-python-build" digest
    digest="$(find core/src core/scripts core/Cargo.toml python/src python/python python/Cargo.toml \
            python/pyproject.toml python/README-section.md Cargo.toml Cargo.lock \
            -type f ! -path '*/__pycache__/*' ! -name '*.pyc' ! -name '*.so' 2>/dev/null \
        | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1)"
    if [ "$(cat "$stamp" 2>/dev/null)" != "$digest" ] || ! "$py" -c 'import ferrolock' 2>/dev/null; then
        echo "bench/run.sh: building ./python into $venv (1-2 min when cold)" >&2
        "$py" -m pip install "${quiet[@]}" --force-reinstall --no-deps ./python
        echo "$digest" >"$stamp"
    fi
}

status=0
if [ "$rust" = 1 ]; then
    FERROLOCK_BENCH_COMMAND="$command_line" "${CARGO:-cargo}" run --release -p ferrolock-bench -- \
        --out "$tmp/rust.md" "${rust_args[@]}" >/dev/null
fi
if [ "$python" = 1 ]; then
    if ensure_venv && "$py" "$root/bench/python/bench_peers.py" --out "$tmp/python.md" \
        --command "$command_line" "${python_args[@]}" >/dev/null; then
        :
    else
        status=1
        echo "bench/run.sh: the Python comparison failed (see above)" >&2
        printf '## Python comparison\n\n**Failed** in this run: see the output of `%s`.\n' \
            "$command_line" >"$tmp/python.md"
    fi
fi
# The C library in release, staged as `make install` stages it; the C loop and its Rust
# baseline; the Go bench linked against the staged library.
run_go() {
    # A fixed prefix, staged afresh: Go's build cache keys a cgo package on its flags but runs
    # pkg-config after, so a cached package could keep the link path of an earlier run's
    # temporary prefix, gone since. The library's hash in CGO_CFLAGS rebuilds the cgo package
    # when the library changed (Go does not look at the files its link flags name).
    local prefix="${CARGO_TARGET_DIR:-$root/target}/bench-ffi" flags libhash
    rm -rf "$prefix"
    env -u FERROLOCK_DEBUG_BUILD make -s --no-print-directory install PREFIX="$prefix" \
        CARGO="${CARGO:-cargo}" >&2
    libhash="$(sha256sum "$prefix/lib/libferrolock.a" | cut -c1-16)"
    "${CARGO:-cargo}" build -q --release --locked -p ferrolock-bench --example blocking_loop >&2
    if command -v pkg-config >/dev/null; then
        flags="$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs ferrolock)"
    else
        flags="-I$prefix/include $prefix/lib/libferrolock.a -lpthread -ldl -lm -lrt -lutil -lgcc_s"
    fi
    # shellcheck disable=SC2086 # the flags are words
    "${CC:-cc}" -std=c11 -Wall -Wextra -Werror -O2 -pthread bench/c/blocking_loop.c \
        -o "$tmp/blocking_loop" $flags
    (cd bench/go && PKG_CONFIG_PATH="$prefix/lib/pkgconfig" \
        CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -DFERROLOCK_LIB_SHA=$libhash" go build -o "$tmp/bench-go" .)
    "$tmp/bench-go" -c-loop "$tmp/blocking_loop" \
        -rust-loop "${CARGO_TARGET_DIR:-$root/target}/release/examples/blocking_loop" \
        -out "$tmp/go-full.md" -summary "$tmp/go.md" -command "$command_line" \
        "${go_args[@]}" >/dev/null
    if [ "$out" != "-" ]; then
        cp "$tmp/go-full.md" "$root/bench/results/go.md"
        echo "bench/run.sh: wrote $root/bench/results/go.md" >&2
    fi
}
if [ "$go" = 1 ]; then
    if run_go; then
        :
    else
        status=1
        echo "bench/run.sh: the Go and C comparison failed (see above)" >&2
        printf '## Go and C comparison (summary)\n\n**Failed** in this run: see the output of `%s`.\n' \
            "$command_line" >"$tmp/go.md"
    fi
fi
# The Java client built offline, as the interop tests build it; the rw scenario on its own
# servers.
run_rw() {
    local cp="${FERROLOCK_REDISSON_CP:-}"
    if [ -z "$cp" ]; then
        mvn -q -B -o -f tests/redisson/pom.xml package >&2
        cp="$root/tests/redisson/target/classes:$(cat tests/redisson/target/classpath.txt)"
    fi
    FERROLOCK_REDISSON_CP="$cp" FERROLOCK_BENCH_COMMAND="$command_line" \
        "${CARGO:-cargo}" run --release -p ferrolock-bench -- --scenario rw \
        --out "$tmp/rw-full.md" --summary "$tmp/rw.md" "${rw_args[@]}" >/dev/null
    if [ "$out" != "-" ]; then
        cp "$tmp/rw-full.md" "$root/bench/results/rw-semaphore.md"
        echo "bench/run.sh: wrote $root/bench/results/rw-semaphore.md" >&2
    fi
}
if [ "$rw" = 1 ]; then
    if run_rw; then
        :
    else
        status=1
        echo "bench/run.sh: the read-write lock and semaphore part failed (see above)" >&2
        printf '## Read-write lock and semaphore (summary)\n\n**Failed** in this run: see the output of `%s`.\n' \
            "$command_line" >"$tmp/rw.md"
    fi
fi
if [ "$node" = 1 ]; then
    node_results=()
    if [ "$out" != "-" ]; then
        node_results=(--md "$root/bench/results/node-uncontended.md"
            --contended-md "$root/bench/results/node-contended.md"
            --svg "$root/bench/results/node.svg")
    fi
    python_results="$tmp/python.md"
    [ -f "$python_results" ] || python_results="$root/bench/results/latest.md"
    node_results+=(--python-results "$python_results")
    # The chart draws the C and Go figures too: this run's (the Go part runs first), else the
    # last committed ones.
    go_results="$tmp/go-full.md"
    [ -f "$go_results" ] || go_results="$root/bench/results/go.md"
    node_results+=(--go-results "$go_results")
    # The addon in release (`npm run build`, as the release packages are built), then the peers, pinned.
    if (cd node && npm install --no-audit --no-fund --silent >&2 \
            && env -u FERROLOCK_DEBUG_BUILD npm run --silent build >&2) \
        && { [ -d bench/node/node_modules/redlock ] \
            || (cd bench/node && npm install --no-audit --no-fund --silent >&2); } \
        && node bench/node/bench_node.js --out "$tmp/node.md" --command "$command_line" \
            "${node_results[@]}" "${node_args[@]}" >/dev/null; then
        :
    else
        status=1
        echo "bench/run.sh: the Node comparison failed (see above)" >&2
        printf '## Node comparison\n\n**Failed** in this run: see the output of `%s`.\n' \
            "$command_line" >"$tmp/node.md"
    fi
fi


# --go-only / --node-only / --rw-only: that part's summary replaces its section of the existing report
# (before its closing line), so that one part can be re-measured without the others.
merge_part() { # summary file, section heading, name of the part
    awk -v summary="$1" -v heading="$2" -v part="$3 part: " '
        function insert(  l) { while ((getline l < summary) > 0) print l; print ""; done = 1 }
        index($0, heading) == 1 { skip = 1; next }
        index($0, part) == 1 { next }
        skip && /^(## |---$)/ { skip = 0 }
        skip { next }
        /^---$/ && !done { insert() }
        { print }
        END { if (!done) { print ""; insert() } }
    ' "$out" >"$tmp/latest.md"
    printf '%s part: `%s`, %d s, merged into the report above.\n' \
        "$3" "$command_line" "$((SECONDS - started))" >>"$tmp/latest.md"
}
only=$((rust + python + node + go + rw))
if [ "$only" = 1 ] && [ "$go" = 1 ] && [ -f "$out" ]; then
    merge_part "$tmp/go.md" "## Go and C comparison" "Go and C"
elif [ "$only" = 1 ] && [ "$rw" = 1 ] && [ -f "$out" ]; then
    merge_part "$tmp/rw.md" "## Read-write lock and semaphore" "Read-write lock and semaphore"
elif [ "$only" = 1 ] && [ "$node" = 1 ] && [ -f "$out" ]; then
    merge_part "$tmp/node.md" "## Node comparison" "Node"
else
{
    if [ -f "$tmp/rust.md" ]; then
        cat "$tmp/rust.md"
    else
        printf '# ferrolock benchmarks\n\n'
    fi
    if [ -f "$tmp/python.md" ]; then
        echo
        cat "$tmp/python.md"
    fi
    if [ -f "$tmp/node.md" ]; then
        echo
        cat "$tmp/node.md"
    fi
    if [ -f "$tmp/go.md" ]; then
        echo
        cat "$tmp/go.md"
    fi
    if [ -f "$tmp/rw.md" ]; then
        echo
        cat "$tmp/rw.md"
    fi
    printf '\n---\nAll parts: `%s`, %d s in total.\n' "$command_line" "$((SECONDS - started))"
} >"$tmp/latest.md"
fi
cat "$tmp/latest.md"
if [ "$out" != "-" ]; then
    mkdir -p "$(dirname "$out")"
    cp "$tmp/latest.md" "$out"
    echo "bench/run.sh: wrote $out" >&2
fi
exit "$status"
