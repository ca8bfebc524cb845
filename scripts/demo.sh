#!/usr/bin/env bash
# One key shared by a Python worker, `ferrolock run` and Node, C and Go workers, on a
# redis-server of our own: the Python worker takes the lock, `ferrolock inspect` shows it as the
# holder, two `ferrolock run` workers and the Node, C and Go ones wait and then take turns (one
# `ferrolock run` prints its metrics with --stats), and a third `ferrolock run`, with
# --wait 100ms, gives up with exit code 75. Checks at the end that no two critical sections
# overlapped. Reuses the Python build of python/test.sh (python/build.sh).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

"$root/scripts/ensure-redis.sh"
# Progress on stderr: a cold build takes minutes (the demo's own output starts after it).
# Tokens are printed by their last 8 characters: they start with the grant time, shared by all.
step() { echo "demo: building $*" >&2; }
step "the ferrolock CLI (cargo build)"
cargo build -q -p ferrolock-cli
bin="${CARGO_TARGET_DIR:-$root/target}/debug/ferrolock"
step "the Python package (python/build.sh)"
py="$(FERROLOCK_DEBUG_BUILD=1 "$root/python/build.sh")"
# The Node addon (as `make test-node` builds it) and the C library for the C and Go workers.
step "the Node addon (npm run build in node/)"
(cd "$root/node" && npm install --no-audit --no-fund --silent && FERROLOCK_DEBUG_BUILD=1 npm run --silent build)
step "the C library (make ffi-lib)"
make -s -C "$root" ffi-lib >/dev/null
stage="$root/target/ffi"

work="$(mktemp -d)"
server_pid=""
python_pid=""
cleanup() {
  for pid in $python_pid $server_pid; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

# A random port can be taken; then our server exits at once and we try another. Readiness is
# checked by pid, so a different server already on the port is never mistaken for ours.
start_redis() {
  local attempt
  for attempt in $(seq 20); do
    port=$((20000 + RANDOM % 40000))
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
      --dir "$work" --daemonize no >"$work/redis.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 100); do
      kill -0 "$server_pid" 2>/dev/null || break
      if redis-cli -p "$port" INFO server 2>/dev/null | grep -q "^process_id:$server_pid"; then
        return 0
      fi
      sleep 0.05
    done
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
  done
  echo "demo: could not start redis-server; last log:" >&2
  cat "$work/redis.log" >&2
  return 1
}
# The C and Go workers, built before any worker starts (the timing below is the demo's).
cat >"$work/worker.c" <<'C'
#include <stdio.h>
#include <string.h>
#include <time.h>
#include "ferrolock.h"
static long long now_ns(void) { struct timespec t; clock_gettime(CLOCK_REALTIME, &t); return t.tv_sec * 1000000000LL + t.tv_nsec; }
int main(int argc, char **argv) {
  ferrolock_options *o = ferrolock_options_new();
  ferrolock_manager *m = NULL;
  ferrolock_lock *lock = NULL;
  ferrolock_error *err = NULL;
  if (ferrolock_options_set_str(o, "nodes", argv[1], &err) || ferrolock_options_set_ms(o, "ttl", 5000, &err) ||
      ferrolock_manager_new(o, &m, &err) || ferrolock_manager_acquire(m, argv[2], NULL, NULL, &lock, &err)) {
    fprintf(stderr, "[c] %s\n", err ? err->message : "failed");
    return 1;
  }
  const char *tok = ferrolock_lock_token(lock); size_t n = strlen(tok);
  printf("[c] got the lock (token …%s), working 300ms\n", tok + (n > 8 ? n - 8 : 0));
  FILE *f = fopen(argv[3], "a"); fprintf(f, "start %lld\n", now_ns()); fclose(f);
  struct timespec t = {0, 300000000L}; nanosleep(&t, NULL);
  f = fopen(argv[3], "a"); fprintf(f, "end %lld\n", now_ns()); fclose(f);
  int rc = ferrolock_lock_release(lock, NULL, &err);
  ferrolock_lock_free(lock); ferrolock_manager_free(m); ferrolock_options_free(o);
  return rc;
}
C
step "the C and Go workers"
cc -std=c11 -O1 -pthread "$work/worker.c" -o "$work/worker-c" -I"$stage/include" "$stage/lib/libferrolock.a" \
  -lpthread -ldl -lm -lrt -lutil -lgcc_s
mkdir -p "$work/goworker"
cat >"$work/goworker/main.go" <<'GO'
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	ferrolock "example.invalid/ferrolock/ffi/go"
)

func main() {
	nodes, key, sections := os.Args[1], os.Args[2], os.Args[3]
	m, err := ferrolock.NewManager(ferrolock.Nodes(nodes), ferrolock.TTL(5*time.Second))
	if err != nil {
		fmt.Fprintln(os.Stderr, "[go]", err)
		os.Exit(1)
	}
	appendLine := func(what string) {
		f, _ := os.OpenFile(sections, os.O_APPEND|os.O_WRONLY, 0o644)
		f.WriteString(what + " " + strconv.FormatInt(time.Now().UnixNano(), 10) + "\n")
		f.Close()
	}
	err = m.WithLock(context.Background(), key, func(ctx context.Context, l *ferrolock.Lock) error {
		tok := l.Token()
		fmt.Printf("[go] got the lock (token …%s), working 300ms\n", tok[max(0, len(tok)-8):])
		appendLine("start")
		time.Sleep(300 * time.Millisecond)
		appendLine("end")
		return nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "[go]", err)
		os.Exit(1)
	}
}
GO
cat >"$work/goworker/go.mod" <<GOMOD
module demo

go 1.21

require example.invalid/ferrolock/ffi/go v0.0.0
replace example.invalid/ferrolock/ffi/go => $root/ffi/go
GOMOD
(cd "$work/goworker" && PKG_CONFIG_PATH="$stage/lib/pkgconfig" GOFLAGS=-mod=mod go build -o "$work/worker-go" . )
start_redis
nodes="redis://127.0.0.1:$port"
key="demo:nightly-report"
sections="$work/sections"
echo "redis-server on port $port (pid $server_pid); lock \"$key\""

# The Python worker: holds the lock until told to go (the file $work/go appears).
"$py" - "$nodes" "$key" "$sections" "$work" <<'PY' &
import os, sys, time
import ferrolock

nodes, key, sections, work = sys.argv[1:]
with ferrolock.redlock(key, nodes=[nodes], ttl=5.0) as lock:
    print(f"[python] got the lock (token …{lock.token[-8:]}), holding it", flush=True)
    with open(sections, "a") as f:
        f.write(f"start {time.time_ns()}\n")
    with open(os.path.join(work, "token"), "w") as f:
        f.write(lock.token)
    while not os.path.exists(os.path.join(work, "go")):
        time.sleep(0.05)
    with open(sections, "a") as f:
        f.write(f"end {time.time_ns()}\n")
print(f"[python] released; grants counted here: {ferrolock.metrics()['demo']['grants']}", flush=True)
PY
python_pid=$!
for _ in $(seq 600); do
  [ -s "$work/token" ] && break
  kill -0 "$python_pid" 2>/dev/null || { echo "demo: FAILED: the Python worker exited" >&2; exit 1; }
  sleep 0.05
done
[ -s "$work/token" ] || { echo "demo: FAILED: the Python worker never got the lock" >&2; exit 1; }

echo "\$ ferrolock inspect $key"
"$bin" inspect --nodes "$nodes" "$key" | tee "$work/inspect"
if ! grep -q "$(cat "$work/token")" "$work/inspect"; then
  echo "demo: FAILED: inspect does not show the Python worker's token" >&2
  exit 1
fi

# The critical section: runs as the child of `ferrolock run`, with the lock held.
critical='
  printf "[run %s] got the lock (token …%s), working 300ms\n" "$1" "${FERROLOCK_TOKEN: -8}"
  echo "start $(date +%s%N)" >>"$2"
  sleep 0.3
  echo "end $(date +%s%N)" >>"$2"
'
pids=()
for n in 1 2; do
  echo "[run $n] waiting for the lock"
  stats=()
  [ "$n" = 1 ] && stats=(--stats)
  "$bin" run "${stats[@]}" --nodes "$nodes" --ttl 5s "$key" -- bash -c "$critical" run "$n" "$sections" \
    2>"$work/stderr-$n" &
  pids+=("$!")
done

# The same key from Node, C and Go: each waits, then appends its section like the others.
echo "[node] waiting for the lock"
node - "$nodes" "$key" "$sections" "$root/node" >"$work/out-node" 2>&1 <<'JS' &
const [nodes, key, sections, pkg] = process.argv.slice(2);
const { withLock } = require(pkg);
const fs = require('fs');
// Wall-clock nanoseconds, finer than Date.now(): the sections are compared with the others'.
const nowNs = () => BigInt(Math.round((performance.timeOrigin + performance.now()) * 1e6));
withLock(key, async (lock) => {
  console.log(`[node] got the lock (token …${lock.token.slice(-8)}), working 300ms`);
  fs.appendFileSync(sections, `start ${nowNs()}\n`);
  await new Promise((r) => setTimeout(r, 300));
  fs.appendFileSync(sections, `end ${nowNs()}\n`);
}, { nodes: [nodes], ttl: 5000 }).then(() => process.exit(0), (e) => { console.error(e); process.exit(1); });
JS
pids+=("$!")

echo "[c] waiting for the lock"
"$work/worker-c" "$nodes" "$key" "$sections" >"$work/out-c" 2>&1 &
pids+=("$!")

echo "[go] waiting for the lock"
"$work/worker-go" "$nodes" "$key" "$sections" >"$work/out-go" 2>&1 &
pids+=("$!")

echo "[impatient] trying with --wait 100ms"
impatient=0
"$bin" run --nodes "$nodes" --wait 100ms "$key" -- echo "[impatient] got the lock (unexpected)" \
  2>/dev/null || impatient=$?
echo "[impatient] gave up: exit code $impatient"

touch "$work/go"
wait "$python_pid"
python_pid=""
failed=0
for pid in "${pids[@]}"; do
  wait "$pid" || failed=$((failed + 1))
done
cat "$work"/out-node "$work"/out-c "$work"/out-go

echo "\$ ferrolock run --stats ...   (run 1's metrics, Prometheus text on stderr; the counters)"
grep -E '^ferrolock_(acquire_attempts_total|grants_total|handoffs_total|wait_seconds_(sum|count)|hold_seconds_(sum|count))\{' \
  "$work/stderr-1" || { echo "demo: FAILED: no metrics from --stats" >&2; cat "$work/stderr-1" >&2; exit 1; }

# Sections must come strictly in turn: start, end, start, end, ... each start after the
# previous end.
if ! awk '
  $1 == "start" { if (open || $2 < last_end) bad = 1; open = 1; n++ }
  $1 == "end"   { if (!open) bad = 1; open = 0; last_end = $2 }
  END { exit (bad || open || n != 6) }
' "$sections"; then
  echo "demo: FAILED: critical sections overlapped:" >&2
  cat "$sections" >&2
  exit 1
fi
if [ "$failed" -ne 0 ] || [ "$impatient" -ne 75 ]; then
  echo "demo: FAILED: $failed run(s) failed; the impatient run exited $impatient, expected 75" >&2
  cat "$work"/stderr-* >&2
  exit 1
fi
echo "summary: the Python worker, 2 \`ferrolock run\`s and the Node, C and Go workers held \"$key\" one at a time (no overlap); the one with --wait 100ms gave up with exit 75"
