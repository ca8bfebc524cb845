#!/usr/bin/env bash
# Runs a command with 3 redis-servers of its own (no persistence, each in its own temp dir),
# then stops them. The command gets FERROLOCK_TEST_PORTS (comma-separated), FERROLOCK_TEST_PIDS
# (the servers' pids, same order, for SIGSTOP/SIGCONT) and FERROLOCK_NODES (all three URLs).
set -euo pipefail
N=${FERROLOCK_TEST_NODES:-3}
ROOT=$(mktemp -d -t ferrolock-ffi-XXXXXX)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do
    kill -CONT "$pid" 2>/dev/null || true
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$ROOT"
}
trap cleanup EXIT

start_one() {
  # A free port found now may be taken before the server binds it: retry on failure.
  local dir=$1 port pid
  STARTED_PORT="" STARTED_PID=""
  for _ in $(seq 1 20); do
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
      --logfile "$dir/redis.log" --daemonize no >/dev/null 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do
      if redis-cli -p "$port" ping >/dev/null 2>&1; then
        STARTED_PORT=$port STARTED_PID=$pid
        return 0
      fi
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.05
    done
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  echo "cannot start redis-server (see $dir/redis.log)" >&2
  return 1
}

PORTS=()
for i in $(seq 1 "$N"); do
  mkdir -p "$ROOT/n$i"
  start_one "$ROOT/n$i"
  PORTS+=("$STARTED_PORT")
  PIDS+=("$STARTED_PID")
done
FERROLOCK_TEST_PORTS=$(IFS=,; echo "${PORTS[*]}")
FERROLOCK_TEST_PIDS=$(IFS=,; echo "${PIDS[*]}")
FERROLOCK_NODES=$(printf 'redis://127.0.0.1:%s,' "${PORTS[@]}")
export FERROLOCK_TEST_PORTS FERROLOCK_TEST_PIDS FERROLOCK_NODES=${FERROLOCK_NODES%,}
"$@"
