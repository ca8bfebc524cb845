#!/usr/bin/env bash
# make dist-smoke: installs each artifact of dist/ (make dist) the way a user without Rust
# would, and takes a lock with it on a redis-server of its own (ffi/tests/with-redis.sh).
# Every install runs under `env -i` with a PATH and HOME holding no cargo, rustc or rustup,
# and first checks that `command -v cargo` fails there. Exits non-zero if any step failed;
# a step that cannot run here prints SKIPPED and is not counted as passed.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -z ${FERROLOCK_NODES:-} ]]; then
  "$root/scripts/ensure-redis.sh"
  exec env FERROLOCK_TEST_NODES=1 "$root/ffi/tests/with-redis.sh" "$0" "$@"
fi
dist=$root/dist
version=$(sed -n '/^\[workspace\.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml")
[[ -f $dist/SHA256SUMS ]] || { echo "dist-smoke: no dist/SHA256SUMS: run make dist first" >&2; exit 1; }
(cd "$dist" && sha256sum --quiet -c SHA256SUMS)
tmp=$(mktemp -d -t ferrolock-smoke-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# A PATH with the system's tools and none of Rust's: only directories without cargo/rustc/rustup.
clean_path=
for d in /usr/local/go/bin /usr/local/bin /usr/bin /bin; do
  [[ -x $d/cargo || -x $d/rustc || -x $d/rustup ]] && continue
  clean_path+=${clean_path:+:}$d
done
passed=() failed=() skipped=()

# clean NAME DIR SCRIPT [PATH-PREFIX]: SCRIPT runs in DIR under env -i (HOME=DIR/home).
clean() {
  local name=$1 dir=$2 script=$3 extra=${4:-}
  mkdir -p "$dir/home"
  printf '\n== %s\n' "$name"
  if (cd "$dir" && env -i PATH="${extra:+$extra:}$clean_path" HOME="$dir/home" LANG=C.UTF-8 \
      FERROLOCK_NODES="$FERROLOCK_NODES" DIST="$dist" VERSION="$version" ROOT="$root" \
      bash -euo pipefail -c 'if command -v cargo; then echo "cargo is reachable" >&2; exit 1; fi; '"$script"); then
    passed+=("$name")
  else
    echo "FAILED: $name" >&2
    failed+=("$name")
  fi
}
skip() { printf '\n== %s\nSKIPPED: %s\n' "$1" "$2"; skipped+=("$1: $2"); }

# Python: the abi3 wheel on each CPython, offline (it has no dependencies).
wheel=$(ls "$dist"/ferrolock-"$version"-cp311-abi3-manylinux*_x86_64.whl)
for minor in 3.11 3.12 3.13; do
  prefix=$(pyenv prefix "$(pyenv versions --bare | grep -E "^${minor//./\\.}(\.[0-9]+)?$" | tail -1)" 2>/dev/null || true)
  if [[ -z $prefix || ! -x $prefix/bin/python3 ]]; then
    echo "dist-smoke: CPython $minor is not installed (pyenv install $minor)" >&2
    failed+=("python $minor: interpreter missing")
    continue
  fi
  clean "wheel on CPython $minor" "$tmp/py$minor" "
    python3 -m venv venv && venv/bin/pip install -q --no-index '$wheel'
    venv/bin/python -c '
import ferrolock
from ferrolock import redlock
assert ferrolock.__version__ == \"$version\", ferrolock.__version__
with redlock(\"smoke:py$minor\", ttl=10.0, wait=5.0) as lock:
    print(\"python $minor: held\", lock.key, \"version\", ferrolock.__version__)
'" "$prefix/bin"
done

# npm: both tarballs, offline, in a fresh project; CommonJS, ESM, TypeScript (strict, es2022).
# The checker is the one node/ pins (its devDependency), installed beside dist's other npm tools
# when node/ has none (a fresh clone that never ran npm install there).
tsc=$root/node/node_modules/typescript/bin/tsc
if [[ ! -f $tsc ]]; then
  tools=$root/.dist-venv/npm
  tsc=$tools/node_modules/typescript/bin/tsc
  [[ -f $tsc ]] || npm install --prefix "$tools" --no-audit --no-fund --silent \
    "typescript@$(node -p "require('$root/node/package.json').devDependencies.typescript")" || true
fi
clean "npm tarballs (CommonJS, ESM)" "$tmp/npm" "
  npm init -y >/dev/null
  npm install --offline --no-audit --no-fund \"\$DIST/ferrolock-linux-x64-gnu-\$VERSION.tgz\" \"\$DIST/ferrolock-\$VERSION.tgz\"
  test ! -e node_modules/ferrolock/src && test ! -e node_modules/ferrolock/Cargo.toml
  cat > cjs.js <<'JS'
const { withLock, version } = require('ferrolock');
withLock('smoke:cjs', async (lock) => console.log('cjs: held', lock.key, 'version', version), { ttl: 10000, wait: 5000 })
  .catch((e) => { console.error(e); process.exit(1); });
JS
  cat > esm.mjs <<'JS'
import { withLock, version } from 'ferrolock';
await withLock('smoke:esm', async (lock) => console.log('esm: held', lock.key, 'version', version), { ttl: 10000, wait: 5000 });
JS
  node cjs.js && node esm.mjs"
if [[ -f $tsc ]]; then
  clean "npm tarballs (TypeScript --strict, lib es2022, no skipLibCheck)" "$tmp/npm" "
    cat > tsconfig.json <<'JSON'
{ \"compilerOptions\": { \"target\": \"ES2022\", \"lib\": [\"ES2022\"], \"module\": \"NodeNext\",
  \"moduleResolution\": \"NodeNext\", \"strict\": true, \"skipLibCheck\": false, \"types\": [],
  \"outDir\": \"out\" }, \"files\": [\"smoke.ts\"] }
JSON
    cat > smoke.ts <<'TS'
import { LockManager, version } from 'ferrolock';
// lib es2022 alone declares no console or process (no DOM, no @types/node): this file's own.
declare const console: { log(...args: unknown[]): void; error(...args: unknown[]): void };
declare const process: { exit(code: number): never };
async function main(): Promise<void> {
  const manager = new LockManager({ ttl: 10_000 });
  const lock = await manager.acquire('smoke:ts');
  const key: string = lock.key;
  console.log('typescript: held', key, 'version', version);
  await lock.release();
  await manager.close();
}
main().catch((e: unknown) => { console.error(e); process.exit(1); });
TS
    node '$tsc' -p . && node out/smoke.js"
else
  skip "npm tarballs (TypeScript)" "typescript could not be installed (npm install --prefix .dist-venv/npm typescript)"
fi

# C: the unpacked tarball, static through pkg-config, dynamic with -lferrolock.
ctar=$dist/libferrolock-$version-x86_64-linux-gnu.tar.gz
if command -v cc >/dev/null && command -v pkg-config >/dev/null; then
  clean "C tarball (static, pkg-config)" "$tmp/c" "
    tar -xzf '$ctar' && lib=\$PWD/libferrolock-\$VERSION-x86_64-linux-gnu
    export PKG_CONFIG_PATH=\$lib/lib/pkgconfig
    cc -std=c11 -Wall -Werror \$ROOT/ffi/examples/hello_lock.c -o hello_static \$(pkg-config --static --cflags --libs ferrolock)
    ! readelf -d hello_static | grep -q libferrolock
    ./hello_static"
  clean "C tarball (shared, -lferrolock)" "$tmp/c" "
    lib=\$PWD/libferrolock-\$VERSION-x86_64-linux-gnu
    cc -std=c11 -Wall -Werror -I\$lib/include \$ROOT/ffi/examples/hello_lock.c -o hello_shared -L\$lib/lib -lferrolock
    readelf -d hello_shared | grep -F 'libferrolock.so.'
    LD_LIBRARY_PATH=\$lib/lib ./hello_shared"
  # Go: the package from the checkout, the library from the unpacked tarball.
  if command -v go >/dev/null; then
    clean "Go (PKG_CONFIG_PATH on the C tarball)" "$tmp/c" "
      export PKG_CONFIG_PATH=\$PWD/libferrolock-\$VERSION-x86_64-linux-gnu/lib/pkgconfig
      export GOFLAGS=-buildvcs=false GOPATH=\$HOME/go GOCACHE=\$HOME/gocache GOPROXY=off
      cd \$ROOT/ffi/go && go run ./examples/withlock"
  else
    skip "Go" "no go toolchain"
  fi
else
  skip "C tarball" "no cc or pkg-config"
fi

# The static CLIs: x86_64 natively, aarch64 under qemu-user-static, installed with apt-get
# when missing (as scripts/ensure-redis.sh installs redis-server); where it cannot be, SKIPPED.
if ! command -v qemu-aarch64-static >/dev/null && command -v apt-get >/dev/null; then
  sudo=; [[ $(id -u) == 0 ]] || sudo=sudo
  echo "qemu-aarch64-static not found: installing qemu-user-static with apt-get" >&2
  { $sudo apt-get update -qq && $sudo apt-get install -y -qq qemu-user-static; } >/dev/null 2>&1 || true
fi
for arch in x86_64 aarch64; do
  run=
  if [[ $arch == aarch64 ]]; then
    if ! run=$(command -v qemu-aarch64-static); then
      skip "CLI ($arch musl, static)" "no qemu-aarch64-static (apt-get install qemu-user-static)"
      continue
    fi
  fi
  clean "CLI ($arch musl, static)" "$tmp/cli-$arch" "
    tar -xzf '$dist/ferrolock-$version-$arch-linux-musl.tar.gz'
    cli='$run '\$PWD/ferrolock-\$VERSION-$arch-linux-musl/ferrolock
    \$cli --version | grep -F \"\$VERSION\"
    \$cli run --nodes \"\${FERROLOCK_NODES%%,*}\" --ttl 10s --wait 5s smoke:cli -- sh -c 'echo cli $arch: held \$FERROLOCK_KEY'"
done

printf '\n== dist-smoke: %d passed, %d failed, %d skipped\n' "${#passed[@]}" "${#failed[@]}" "${#skipped[@]}"
for s in "${failed[@]}"; do echo "  failed: $s"; done
for s in "${skipped[@]}"; do echo "  skipped: $s"; done
((${#failed[@]} == 0))
