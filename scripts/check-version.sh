#!/usr/bin/env bash
# The version is set once, in Cargo.toml's [workspace.package]; every other place that states
# it must agree (the crates inherit it, the Python package takes it from its crate). Fails,
# naming each place that disagrees. Reads files only: runs in well under a second.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

want=$(sed -n '/^\[workspace\.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' Cargo.toml)
if ! [[ $want =~ ^([0-9]+)\.([0-9]+)\.([0-9]+)$ ]]; then
  echo "check-version: Cargo.toml [workspace.package] version is '$want', not MAJOR.MINOR.PATCH" >&2
  exit 1
fi
major=${BASH_REMATCH[1]} minor=${BASH_REMATCH[2]} patch=${BASH_REMATCH[3]}

bad=0
expect() { # expect WHERE GOT WANT
  if [[ $2 != "$3" ]]; then
    echo "check-version: $1 says '$2', the workspace (Cargo.toml) '$3'" >&2
    bad=1
  fi
}

for manifest in */Cargo.toml tests/*/Cargo.toml; do
  grep -q '^\[package\]' "$manifest" || continue
  expect "$manifest version" "$(grep -m1 -E '^version(\.workspace)? *=' "$manifest" || true)" "version.workspace = true"
done
# The package's own version: the first "version" key, and the lock file's root package.
expect node/package.json "$(sed -n 's/^  "version": "\(.*\)",$/\1/p' node/package.json)" "$want"
expect node/package-lock.json "$(sed -n 's/^  "version": "\(.*\)",$/\1/p' node/package-lock.json)" "$want"
header=ffi/include/ferrolock.h
for part in MAJOR:$major MINOR:$minor PATCH:$patch STRING:\"$want\"; do
  expect "$header FERROLOCK_VERSION_${part%%:*}" \
    "$(sed -n "s/^#define FERROLOCK_VERSION_${part%%:*} //p" $header)" "${part#*:}"
done
expect "ffi/go/version.go Version" "$(sed -n 's/^const Version = "\(.*\)"$/\1/p' ffi/go/version.go)" "$want"
# The newest release entry (## [X.Y.Z] - date), below an optional ## [Unreleased].
expect "CHANGELOG.md's newest release" \
  "$(grep -m1 -E '^## \[[0-9]' CHANGELOG.md | sed -n 's/^## \[\([^]]*\)\].*/\1/p' || true)" "$want"

if ((bad)); then
  echo "check-version: set the version in Cargo.toml and update the places above to match" >&2
  exit 1
fi
echo "check-version: $want everywhere"
