#!/usr/bin/env bash
# Builds the Python package into a venv (created if missing) and prints the venv's python.
# The wheel is rebuilt only when a source it is built from changed (a cold build takes about
# 1-1.5 min on 2 cores; cargo keeps later builds incremental). Used by python/test.sh and
# `make demo`. Progress goes to stderr, so `py="$(python/build.sh)"` works.
#
# FERROLOCK_DEBUG_BUILD=1 (set by `make test` and `make demo`) builds with cargo's dev profile
# into the same target/debug as `cargo test`: no second, optimised copy of every dependency
# (disk and minutes on a cold CI machine), and the tests run on a debug build as they must
# pass on one. `pip install ./python` and the bench's venv build release.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${FERROLOCK_VENV:-$root/.venv}"
python="${PYTHON:-python3}"
pip_quiet=(-q --disable-pip-version-check)

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv" >&2
fi
py="$venv/bin/python"

# Rebuild only when the Rust or Python sources of the package changed.
stamp="$venv/.ferrolock-python-build"
digest="$(cd "$root" && find core/src core/scripts core/Cargo.toml python/src python/python \
        python/Cargo.toml python/pyproject.toml python/README-section.md Cargo.toml Cargo.lock \
        python/build.sh -type f ! -path '*/__pycache__/*' ! -name '*.pyc' ! -name '*.so' 2>/dev/null \
    | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1)-${FERROLOCK_DEBUG_BUILD:+dev}"
maturin_args=()
[ -n "${FERROLOCK_DEBUG_BUILD:-}" ] && maturin_args=(--profile dev)
if [ "$(cat "$stamp" 2>/dev/null)" != "$digest" ] || ! "$py" -c 'import ferrolock' 2>/dev/null; then
    echo "python: building and installing ./python into $venv" >&2
    (cd "$root" && MATURIN_PEP517_ARGS="${maturin_args[*]}" \
        "$py" -m pip install "${pip_quiet[@]}" ./python >&2)
    echo "$digest" >"$stamp"
fi
echo "$py"
