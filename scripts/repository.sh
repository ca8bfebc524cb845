#!/usr/bin/env bash
# The repository URL is set in ONE place: Cargo.toml's [workspace.package] `repository`.
# The Go module path is derived from it (the URL without its scheme, plus /ffi/go), and Go
# release tags are `ffi/go/vX.Y.Z` (a module in a subdirectory is tagged with its path).
#   scripts/repository.sh url        the URL ($REPO_URL overrides it, for a test run of make dist)
#   scripts/repository.sh go-module  the Go module path derived from that URL
#   scripts/repository.sh check      fails when a file states another URL or module path than Cargo.toml
#   scripts/repository.sh set URL    rewrites Cargo.toml and every file that derives from it
#   scripts/repository.sh release    fails while the URL is still the placeholder (make dist)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

placeholder=https://example.invalid/ferrolock
cargo_url() { sed -n '/^\[workspace\.package\]/,/^\[/s/^repository = "\(.*\)"$/\1/p' Cargo.toml; }
module_of() { local u=${1%/}; u=${u#*://}; echo "${u%.git}/ffi/go"; }
url() { echo "${REPO_URL:-$(cargo_url)}"; }
# Files that carry the module path or the URL (go.mod is the module's own declaration).
derived_files() {
  git ls-files -- ffi/go bench/go scripts/demo.sh README.md | grep -E '\.(go|mod|md|sh)$'
}

case ${1:-} in
  url) url ;;
  go-module) module_of "$(url)" ;;
  check)
    want=$(module_of "$(cargo_url)")
    got=$(sed -n 's/^module //p' ffi/go/go.mod)
    if [[ $got != "$want" ]]; then
      echo "repository: ffi/go/go.mod says module '$got', Cargo.toml's repository gives '$want'" >&2
      echo "repository: run scripts/repository.sh set <URL> to change it everywhere" >&2
      exit 1
    fi
    py=$(sed -n 's/^Repository = "\(.*\)"$/\1/p' python/pyproject.toml)
    if [[ $py != "$(cargo_url)" ]]; then
      echo "repository: python/pyproject.toml says '$py', Cargo.toml's repository is '$(cargo_url)'" >&2
      echo "repository: run scripts/repository.sh set <URL> to change it everywhere" >&2
      exit 1
    fi
    echo "repository: $(cargo_url) (Go module $want)"
    ;;
  release)
    u=$(url)
    if [[ $u == *example.invalid* ]]; then
      cat >&2 <<MSG
make dist: the repository URL is still the placeholder '$u'.
Set it once with   scripts/repository.sh set https://github.com/OWNER/ferrolock
(it rewrites Cargo.toml's [workspace.package] repository, the Go module path and its imports),
or, for a test run only,   REPO_URL=https://github.com/OWNER/ferrolock make dist
MSG
      exit 1
    fi
    echo "$u"
    ;;
  set)
    new=${2:?usage: scripts/repository.sh set URL}
    [[ $new =~ ^https://[^/]+/.+ ]] || { echo "repository: '$new' is not an https:// URL with a path" >&2; exit 1; }
    new=${new%/}; new=${new%.git}
    old=$(cargo_url)
    old_mod=$(module_of "$old") new_mod=$(module_of "$new")
    sed -i "/^\[workspace\.package\]/,/^\[/s|^repository = \".*\"$|repository = \"$new\"|" Cargo.toml
    # The bench module sits next to ffi/go: the same prefix.
    derived_files | xargs sed -i -e "s|${old_mod%/ffi/go}/|${new_mod%/ffi/go}/|g"
    sed -i "s|^Repository = \".*\"$|Repository = \"$new\"|" python/pyproject.toml
    echo "repository: $old -> $new (Go module $new_mod; tag Go releases ffi/go/vX.Y.Z)"
    ;;
  *) sed -n '2,9s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
esac
