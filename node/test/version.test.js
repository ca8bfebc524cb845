'use strict';
// require('ferrolock').version (and the ESM export) is the workspace's version, read from
// Cargo.toml, the one place it is set.
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');

function workspaceVersion() {
  const toml = fs.readFileSync(path.join(__dirname, '..', '..', 'Cargo.toml'), 'utf8');
  const section = toml.split(/^\[workspace\.package\]$/m)[1].split(/^\[/m)[0];
  return section.match(/^version = "([^"]+)"$/m)[1];
}

test('version is the workspace version, in CommonJS and ESM', async () => {
  const want = workspaceVersion();
  assert.match(want, /^\d+\.\d+\.\d+/);
  assert.equal(require('..').version, want);
  const esm = await import('../index.mjs');
  assert.equal(esm.version, want);
  assert.equal(esm.default.version, want);
});

// FERROLOCK_NATIVE_PATH naming a file that is not the addon is said so at require, naming the
// variable and the path (it failed later with "native.optionTable is not a function").
test('FERROLOCK_NATIVE_PATH to something other than the addon is named at require', () => {
  const { spawnSync } = require('node:child_process');
  const os = require('node:os');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ferrolock-native-'));
  const notAddon = path.join(dir, 'other.js');
  fs.writeFileSync(notAddon, 'module.exports = { hello: 1 };\n');
  try {
    const out = spawnSync(process.execPath, ['-e', "require(process.argv[1])", path.join(__dirname, '..')], {
      env: { ...process.env, FERROLOCK_NATIVE_PATH: notAddon },
      encoding: 'utf8',
    });
    assert.notEqual(out.status, 0);
    assert.match(out.stderr, /FERROLOCK_NATIVE_PATH='[^']*other\.js' is not ferrolock's native addon/);
    assert.doesNotMatch(out.stderr, /is not a function/);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

// Bundlers and tools (and `require('ferrolock/package.json').version`) read the manifest
// through the exports map, which refused it (ERR_PACKAGE_PATH_NOT_EXPORTED). Resolved here by
// the package's own name (a self-reference goes through its exports, as a dependent's does).
test("'ferrolock/package.json' is exported, to require and to import", async () => {
  const manifest = path.join(__dirname, '..', 'package.json');
  assert.equal(require.resolve('ferrolock/package.json'), manifest);
  assert.equal(require('ferrolock/package.json').name, 'ferrolock');
  const esm = await import('ferrolock/package.json', { with: { type: 'json' } });
  assert.equal(esm.default.version, require('..').version);
});
