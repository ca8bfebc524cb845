#!/usr/bin/env bash
# The Python package's checks: build it into a venv (created if missing), check the stubs
# against the built module (mypy.stubtest), and run the pytest suite against real
# redis-servers that the suite starts itself. Extra arguments go to pytest.
#
#   python/test.sh                 # everything
#   python/test.sh -k lost -x      # a subset
#
# The package is built by python/build.sh (only when its sources changed).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pip_quiet=(-q --disable-pip-version-check)

command -v redis-server >/dev/null || "$root/scripts/ensure-redis.sh"

py="$("$root/python/build.sh")"

# Test tools, pinned to a major line; installed once.
# uvloop: the abandoned-scope tests run on it as well as on asyncio's own loop.
if ! "$py" -c 'import pytest, redis, mypy, prometheus_client, uvloop' 2>/dev/null; then
    "$py" -m pip install "${pip_quiet[@]}" "pytest>=8,<10" "redis>=5,<8" "mypy>=1.11,<2" \
        "prometheus_client>=0.20,<1" "uvloop>=0.19,<1"
fi

# Stubs vs the built module. Run outside the source tree so the installed package is checked.
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
(cd "$scratch" && "$py" -m mypy.stubtest ferrolock)

cd "$root/python"
"$py" -m pytest -p no:cacheprovider tests "$@"
