#!/usr/bin/env bash
# The npm packages of a release (called by scripts/dist.sh DIST URL), wired as napi-rs does:
#   ferrolock                 JavaScript, .d.ts, LICENSE, README; no Rust sources, no install
#                             script, no dependencies; optionalDependencies pin the platform
#                             packages to this version (lib/native.js loads the matching one)
#   ferrolock-linux-x64-gnu   the stripped addon, built for glibc 2.17 (cargo-zigbuild from
#                             .dist-venv), os/cpu/libc set so npm installs
#                             it only where it runs
# Both are packed into DIST and checked with publint and @arethetypeswrong/cli (installed
# under .dist-venv/npm, not globally).
#   dist-node.sh --lint       the main package alone (no addon build: seconds), packed into a
#                             temporary directory and given the same checks; `make test` runs it
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
lint=0
if [[ ${1:-} == --lint ]]; then
  lint=1
  dist=$(mktemp -d) url=$("$root/scripts/repository.sh" url)
  trap 'rm -rf "$dist"' EXIT
else
  dist=${1:?usage: dist-node.sh DIST URL | --lint} url=${2:?usage: dist-node.sh DIST URL | --lint}
fi
version=$(node -p "require('$root/node/package.json').version")
stage=$root/target/dist/npm$([[ $lint == 1 ]] && echo -lint)
rm -rf "$stage" && mkdir -p "$stage"

tools=$root/.dist-venv/npm
[[ -x $tools/node_modules/.bin/attw && -x $tools/node_modules/.bin/publint ]] ||
  npm install --prefix "$tools" --no-audit --no-fund --silent publint@0.3 @arethetypeswrong/cli@0.18

# The platform packages this release has: the triple -> npm's platform name, os, cpu, libc.
platforms=("x86_64-unknown-linux-gnu linux-x64-gnu linux x64 glibc")

cd "$root/node"
optional={}
for entry in "${platforms[@]}"; do
  read -r triple platform os cpu libc <<<"$entry"
  pkg=ferrolock-$platform
  optional=$(node -e 'const o = JSON.parse(process.argv[1]); o[process.argv[2]] = process.argv[3]; console.log(JSON.stringify(o))' \
    "$optional" "$pkg" "$version")
  [[ $lint == 1 ]] && continue
  dir=$stage/$pkg
  mkdir -p "$dir"
  # What `napi build --platform --release` does on Linux (a cdylib renamed .node), with zig as
  # the linker for the oldest glibc: napi's -x runs plain cargo when the target is the host's.
  cargo zigbuild --locked --release -p ferrolock-node --target "$triple.2.17"
  cp "${CARGO_TARGET_DIR:-$root/target}/$triple/release/libferrolock_node.so" "$dir/ferrolock.$platform.node"
  strip "$dir/ferrolock.$platform.node"
  objdump -T "$dir/ferrolock.$platform.node" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1
  cp "$root/LICENSE" "$dir/"
  PKG=$pkg VERSION=$version PLATFORM=$platform OS=$os CPU=$cpu LIBC=$libc URL=$url node -e '
    const e = process.env;
    const pkg = {
      name: e.PKG, version: e.VERSION,
      description: `The ferrolock native addon for ${e.PLATFORM} (installed by the ferrolock package)`,
      license: "Apache-2.0",
      repository: { type: "git", url: `git+${e.URL}.git`, directory: "node" },
      type: "commonjs",
      main: `ferrolock.${e.PLATFORM}.node`,
      files: [`ferrolock.${e.PLATFORM}.node`, "LICENSE"],
      os: [e.OS], cpu: [e.CPU], libc: [e.LIBC],
      engines: { node: ">=18.18" },
    };
    require("fs").writeFileSync(process.argv[1], JSON.stringify(pkg, null, 2) + "\n");
  ' "$dir/package.json"
  printf '# %s\n\nThe prebuilt native addon of [ferrolock](%s) for %s. Install `ferrolock`, which depends on it.\n' \
    "$pkg" "$url" "$platform" > "$dir/README.md"
done

main=$stage/ferrolock
mkdir -p "$main"
cp -r index.js index.mjs index.d.ts index.d.mts lib "$main/"
cp "$root/LICENSE" "$main/"
# The project README, then the Node details it links to (node/README-section.md), so that the
# package page holds both.
{ cat "$root/README.md"; echo; cat "$root/node/README-section.md"; } > "$main/README.md"
OPTIONAL=$optional URL=$url node -e '
  const fs = require("fs");
  const pkg = JSON.parse(fs.readFileSync("package.json", "utf8"));
  // What a user installs: no build scripts, no build tools, no napi config.
  for (const k of ["scripts", "devDependencies", "dependencies", "overrides", "napi"]) delete pkg[k];
  pkg.repository = { type: "git", url: `git+${process.env.URL}.git`, directory: "node" };
  pkg.homepage = process.env.URL;
  pkg.keywords = ["redis", "lock", "distributed-lock", "redlock", "mutex", "fencing"];
  pkg.optionalDependencies = JSON.parse(process.env.OPTIONAL);
  fs.writeFileSync(process.argv[1], JSON.stringify(pkg, null, 2) + "\n");
' "$main/package.json"

for dir in "$stage"/*/; do
  (cd "$dir" && npm pack --silent --pack-destination "$dist" >/dev/null)
  "$tools/node_modules/.bin/publint" --strict "$dir"
done
tarball=$dist/ferrolock-$version.tgz
# The main package as published: no install script, every platform pin equal to the version.
tar -xOzf "$tarball" package/package.json | node -e '
  const pkg = JSON.parse(require("fs").readFileSync(0, "utf8"));
  const bad = [];
  for (const s of ["preinstall", "install", "postinstall"]) if (pkg.scripts?.[s]) bad.push(`scripts.${s}`);
  if (pkg.dependencies && Object.keys(pkg.dependencies).length) bad.push("dependencies");
  for (const [n, v] of Object.entries(pkg.optionalDependencies)) if (v !== pkg.version) bad.push(`${n}@${v}`);
  if (bad.length) { console.error(`dist-node: the packed ferrolock has ${bad.join(", ")}`); process.exit(1); }
'
"$tools/node_modules/.bin/attw" --format table-flipped "$tarball"
