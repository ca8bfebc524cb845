#!/usr/bin/env bash
# The Python package's checks: build it into a venv (created if missing), check the stubs
# against the built module (mypy.stubtest), and run the pytest suite against real
# redis-servers that the suite starts itself. Extra arguments go to pytest.
#
#   python/test.sh                 # everything
#   python/test.sh -k lost -x      # a subset
#
# The wheel is rebuilt only when a source it is built from changed (a cold build takes about
# 1-1.5 min on 2 cores; cargo keeps later builds incremental).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${FERROLOCK_VENV:-$root/.venv}"
python="${PYTHON:-python3}"
pip_quiet=(-q --disable-pip-version-check)

command -v redis-server >/dev/null || "$root/scripts/ensure-redis.sh"

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
py="$venv/bin/python"

# Test tools, pinned to a major line; installed once.
if ! "$py" -c 'import pytest, redis, mypy, prometheus_client' 2>/dev/null; then
    "$py" -m pip install "${pip_quiet[@]}" "pytest>=8,<10" "redis>=5,<8" "mypy>=1.11,<2" \
        "prometheus_client>=0.20,<1"
fi

# Rebuild only when the Rust or Python sources of the package changed.
stamp="$venv/.ferrolock-python-build"
digest="$(cd "$root" && find core/src core/scripts core/Cargo.toml python/src python/python \
        python/Cargo.toml python/pyproject.toml python/README-section.md Cargo.toml Cargo.lock \
        -type f ! -path '*/__pycache__/*' ! -name '*.pyc' ! -name '*.so' 2>/dev/null \
    | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$digest" ] || ! "$py" -c 'import ferrolock' 2>/dev/null; then
    echo "python: building and installing ./python into $venv"
    (cd "$root" && "$py" -m pip install "${pip_quiet[@]}" ./python)
    echo "$digest" >"$stamp"
fi

# Stubs vs the built module. Run outside the source tree so the installed package is checked.
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
(cd "$scratch" && "$py" -m mypy.stubtest ferrolock)

cd "$root/python"
"$py" -m pytest -p no:cacheprovider tests "$@"
