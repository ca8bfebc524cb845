'use strict';
// `npm run build`: builds the native addon from source with @napi-rs/cli (a devDependency:
// `npm install` in node/ first), in release, or in debug with FERROLOCK_DEBUG_BUILD=1 (make
// test-node, to reuse the test build). The released packages carry a prebuilt addon instead
// (ferrolock-<platform> packages, scripts/dist-node.sh) and no install script. The `napi` bin
// is looked up from this folder, from where npm was started, then fetched with npx.
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const here = path.resolve(__dirname, '..');
const release = process.env.FERROLOCK_DEBUG_BUILD ? [] : ['--release'];
const args = ['build', '--platform', ...release, '--no-js', '--dts', 'native.d.ts'];

function napiBin() {
  const roots = [here, process.env.INIT_CWD, process.cwd()].filter(Boolean);
  try {
    const pkg = require.resolve('@napi-rs/cli/package.json', { paths: roots });
    const bin = require(pkg).bin;
    const rel = typeof bin === 'string' ? bin : bin.napi;
    return path.join(path.dirname(pkg), rel);
  } catch {
    return null;
  }
}

function run(cmd, argv) {
  const r = spawnSync(cmd, argv, { cwd: here, stdio: 'inherit' });
  return r.status === 0;
}

// The debug build on Linux is cargo's own, copied where native.js looks: napi v3 always passes
// `--target <host>`, which builds every dependency a second time into target/<triple>/ (on a
// cold CI machine, minutes and a quarter GB beside the `cargo test` build it could reuse).
function cargoDebugBuild() {
  const glibc = !!process.report?.getReport?.().header?.glibcVersionRuntime;
  const platform = `linux-${process.arch}-${glibc ? 'gnu' : 'musl'}`;
  if (!run('cargo', ['build', '--locked', '-p', 'ferrolock-node'])) return false;
  const targetDir = process.env.CARGO_TARGET_DIR || path.join(here, '..', 'target');
  fs.copyFileSync(path.join(targetDir, 'debug', 'libferrolock_node.so'), path.join(here, `ferrolock.${platform}.node`));
  return true;
}

const bin = napiBin();
const ok =
  process.env.FERROLOCK_DEBUG_BUILD && process.platform === 'linux'
    ? cargoDebugBuild()
    : bin
      ? run(process.execPath, [bin, ...args])
      : run('npx', ['--yes', '--package=@napi-rs/cli@3', '--', 'napi', ...args]);
if (!ok || !fs.readdirSync(here).some((f) => /^ferrolock\..*\.node$/.test(f))) {
  console.error('ferrolock: building the native addon failed (needs a Rust toolchain: https://rustup.rs)');
  process.exit(1);
}
