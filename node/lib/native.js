'use strict';
// Loads the native addon, as napi-rs packages do. In order:
//   1. FERROLOCK_NATIVE_PATH, an explicit path to a ferrolock.*.node (when set, only it);
//   2. the prebuilt platform package, ferrolock-<platform>-<arch>[-<libc>] (an
//      optionalDependency of the released package, pinned to its version: npm installs
//      only the one matching os/cpu/libc);
//   3. a local build in the package folder (`npm run build` in node/, from source).
// When none fits, the error names the package this platform needs.
const fs = require('node:fs');
const path = require('node:path');

const root = path.resolve(__dirname, '..');
const { platform } = require('./platform');
const packageName = `ferrolock-${platform}`;

// What was loaded, checked for the addon's shape: another file (a path set by mistake, another
// package's addon) failed later, far from its cause ("native.optionTable is not a function").
function checked(addon, from) {
  if (addon === null || typeof addon !== 'object' || typeof addon.optionTable !== 'function' ||
      typeof addon.NativeManager !== 'function') {
    throw new Error(
      `ferrolock: ${from} is not ferrolock's native addon (a ferrolock.${platform}.node)`,
    );
  }
  return addon;
}

function load() {
  const explicit = process.env.FERROLOCK_NATIVE_PATH;
  if (explicit) {
    if (!fs.existsSync(explicit)) {
      throw new Error(`ferrolock: FERROLOCK_NATIVE_PATH='${explicit}' does not exist`);
    }
    return checked(require(path.resolve(explicit)), `FERROLOCK_NATIVE_PATH='${explicit}'`);
  }
  let fromPackage;
  try {
    fromPackage = require.resolve(packageName);
  } catch (e) {
    if (e.code !== 'MODULE_NOT_FOUND') throw e;
  }
  if (fromPackage) return checked(require(fromPackage), `the package ${packageName} (${fromPackage})`);
  const local = path.join(root, `ferrolock.${platform}.node`);
  if (fs.existsSync(local)) return checked(require(local), local);
  throw new Error(
    `ferrolock: no native addon for ${platform}: the package ${packageName} is not installed ` +
      `(npm installs it with ferrolock unless optional dependencies are omitted), no local build ` +
      `${local} exists (\`npm run build\` in a checkout's node/, needs Rust), and ` +
      `FERROLOCK_NATIVE_PATH is not set`,
  );
}

module.exports = load();
