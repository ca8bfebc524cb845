#!/usr/bin/env bash
# The fault suite: builds the test bed's proxy binary and the Python package (into .venv, as
# python/test.sh does), then runs pytest on tests/faults (K1-K11 and the short chaos run), or
# with `chaos` as first argument the chaos runner.
#
#   tests/faults/run.sh                    # K1-K11 + the ~60 s chaos run
#   tests/faults/run.sh -k k4              # a subset
#   tests/faults/run.sh chaos --duration 10m --seed 7
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${FERROLOCK_VENV:-$root/.venv}"
cargo build --locked -q -p ferrolock-testbed --bin testbed-proxy
# Builds or refreshes the package only when its sources changed; collects nothing else.
"$root/python/test.sh" --collect-only -q >/dev/null
export FAULTS_PROXY_BIN="${CARGO_TARGET_DIR:-$root/target}/debug/testbed-proxy"
if [ "${1:-}" = chaos ]; then
    shift
    exec "$venv/bin/python" "$root/tests/faults/chaos.py" "$@"
fi
exec "$venv/bin/python" -m pytest -p no:cacheprovider "$root/tests/faults" "$@"
