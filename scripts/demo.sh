#!/usr/bin/env bash
# Four `ferrolock run` workers contend for one key on a redis-server of our own and take turns;
# a fifth, with --wait 100ms, gives up with exit code 75. Checks at the end that no two
# critical sections overlapped.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

"$root/scripts/ensure-redis.sh"
cargo build -q -p ferrolock-cli
bin="${CARGO_TARGET_DIR:-$root/target}/debug/ferrolock"

work="$(mktemp -d)"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
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
start_redis
nodes="redis://127.0.0.1:$port"
key="demo:nightly-report"
sections="$work/sections"
echo "redis-server on port $port (pid $server_pid); 4 workers contend for lock \"$key\""

# The critical section: runs as the child of `ferrolock run`, with the lock held.
critical='
  printf "[worker %s] got the lock (token %s…) at %s, working 300ms\n" \
    "$1" "${FERROLOCK_TOKEN:0:8}" "$(date +%H:%M:%S.%3N)"
  echo "start $(date +%s%N)" >>"$2"
  sleep 0.3
  echo "end $(date +%s%N)" >>"$2"
  printf "[worker %s] done\n" "$1"
'

started=$(date +%s%N)
pids=()
for n in 1 2 3 4; do
  echo "[worker $n] waiting for the lock"
  "$bin" run --nodes "$nodes" --ttl 5s "$key" -- bash -c "$critical" worker "$n" "$sections" &
  pids+=("$!")
done

# Started once a worker surely holds the lock, so it finds it taken.
sleep 0.1
echo "[impatient] trying with --wait 100ms"
impatient=0
"$bin" run --nodes "$nodes" --wait 100ms "$key" -- echo "[impatient] got the lock (unexpected)" || impatient=$?
echo "[impatient] gave up: exit code $impatient"

failed=0
for pid in "${pids[@]}"; do
  wait "$pid" || failed=$((failed + 1))
done
elapsed_ms=$((($(date +%s%N) - started) / 1000000))

# Sections must come strictly in turn: start, end, start, end, ... each start after the
# previous end.
if ! awk '
  $1 == "start" { if (open || $2 < last_end) bad = 1; open = 1; n++ }
  $1 == "end"   { if (!open) bad = 1; open = 0; last_end = $2 }
  END { exit (bad || open || n != 4) }
' "$sections"; then
  echo "demo: FAILED: critical sections overlapped:" >&2
  cat "$sections" >&2
  exit 1
fi
if [ "$failed" -ne 0 ] || [ "$impatient" -ne 75 ]; then
  echo "demo: FAILED: $failed worker(s) failed; the impatient run exited $impatient, expected 75" >&2
  exit 1
fi
echo "summary: 4 workers held \"$key\" one at a time (no overlap) in ${elapsed_ms}ms; the one with --wait 100ms gave up with exit 75"
