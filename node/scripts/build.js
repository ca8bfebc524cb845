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

const bin = napiBin();
const ok = bin
  ? run(process.execPath, [bin, ...args])
  : run('npx', ['--yes', '--package=@napi-rs/cli@3', '--', 'napi', ...args]);
if (!ok || !fs.readdirSync(here).some((f) => /^ferrolock\..*\.node$/.test(f))) {
  console.error('ferrolock: building the native addon failed (needs a Rust toolchain: https://rustup.rs)');
  process.exit(1);
}
