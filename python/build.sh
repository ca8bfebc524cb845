#!/usr/bin/env bash
# Builds the Python package into a venv (created if missing) and prints the venv's python.
# The wheel is rebuilt only when a source it is built from changed (a cold build takes about
# 1-1.5 min on 2 cores; cargo keeps later builds incremental). Used by python/test.sh and
# `make demo`. Progress goes to stderr, so `py="$(python/build.sh)"` works.
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
        -type f ! -path '*/__pycache__/*' ! -name '*.pyc' ! -name '*.so' 2>/dev/null \
    | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$digest" ] || ! "$py" -c 'import ferrolock' 2>/dev/null; then
    echo "python: building and installing ./python into $venv" >&2
    (cd "$root" && "$py" -m pip install "${pip_quiet[@]}" ./python >&2)
    echo "$digest" >"$stamp"
fi
echo "$py"
