#!/usr/bin/env bash
# The cross-language tests (`make test-interop`): Python, Node and the CLI on one key. Builds
# what is missing (the Python package into .venv as python/test.sh does, the CLI, the Node
# addon when node/ has none), then runs pytest on tests/interop.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${FERROLOCK_VENV:-$root/.venv}"
cargo build --locked -q -p ferrolock-cli
"$root/python/test.sh" --collect-only -q >/dev/null
if ! ls "$root"/node/*.node >/dev/null 2>&1; then
    (cd "$root/node" && npm install --no-audit --no-fund && FERROLOCK_DEBUG_BUILD=1 npm run build)
fi
export FERROLOCK_CLI="${CARGO_TARGET_DIR:-$root/target}/debug/ferrolock"
exec "$venv/bin/python" -m pytest -p no:cacheprovider "$root/tests/interop" "$@"
