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
