'use strict';
// `npm run build`: builds the native addon from source with @napi-rs/cli (a devDependency:
// `npm install` in node/ first), in release, or in debug with FERROLOCK_DEBUG_BUILD=1 (make
// test-node; see cargoDebugBuild below). The released packages carry a prebuilt addon instead
// (ferrolock-<platform> packages, scripts/dist-node.sh) and no install script. The `napi` bin
// is looked up from this folder, from where npm was started, then fetched with npx.
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const { glibc, platform } = require('../lib/platform');

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

// The debug build on Linux (glibc) is cargo's own, copied where native.js looks: napi v3
// always passes `--target <host>`, which builds every dependency a second time into
// target/<triple>/ (on a cold CI machine, minutes and a quarter GB beside the dev builds of
// the Python module and the C library, whose dependencies it shares). cargo names the library
// it built (its JSON messages), wherever its configuration puts target/. On musl, napi adds
// flags a plain build lacks, so napi builds there.
function cargoDebugBuild() {
  const r = spawnSync('cargo', ['build', '--locked', '-p', 'ferrolock-node', '--message-format=json-render-diagnostics'], {
    cwd: here,
    stdio: ['inherit', 'pipe', 'inherit'],
    encoding: 'utf8',
    maxBuffer: 256 * 1024 * 1024,
  });
  if (r.status !== 0) return false;
  let built;
  for (const line of r.stdout.split('\n')) {
    if (!line.startsWith('{')) continue;
    const m = JSON.parse(line);
    if (m.reason === 'compiler-artifact' && m.target?.name === 'ferrolock_node') {
      built = m.filenames.find((f) => f.endsWith('.so'));
    }
  }
  if (!built) return false;
  // A copy beside it, then a rename: a process that has the old addon loaded keeps its file.
  const dest = path.join(here, `ferrolock.${platform}.node`);
  const tmp = `${dest}.${process.pid}.tmp`;
  fs.copyFileSync(built, tmp);
  fs.renameSync(tmp, dest);
  return true;
}

const bin = napiBin();
const ok =
  process.env.FERROLOCK_DEBUG_BUILD && glibc
    ? cargoDebugBuild()
    : bin
      ? run(process.execPath, [bin, ...args])
      : run('npx', ['--yes', '--package=@napi-rs/cli@3', '--', 'napi', ...args]);
if (!ok || !fs.readdirSync(here).some((f) => /^ferrolock\..*\.node$/.test(f))) {
  console.error('ferrolock: building the native addon failed (needs a Rust toolchain: https://rustup.rs)');
  process.exit(1);
}
