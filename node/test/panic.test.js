'use strict';
// A panic inside the library reaches the logger, never stderr. `__panicForTest` is a hidden
// native function (not exported by index.js) that panics on one of the core's runtime
// threads; nothing in the library panics on purpose. It runs in a child process so its stderr
// can be read whole.
const test = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const path = require('node:path');

const CHILD = `
const { setLogger } = require(${JSON.stringify(path.resolve(__dirname, '..'))});
const native = require(${JSON.stringify(path.resolve(__dirname, '..', 'lib', 'native'))});
const records = [];
let seen;
const logged = new Promise((r) => { seen = r; });
setLogger((rec) => {
  records.push(rec);
  if (rec.message.includes('__panicForTest was called')) seen(rec);
});
(async () => {
  const text = await native.__panicForTest();
  console.log('task ended:', text);
  const rec = await logged;
  console.log('logged:', JSON.stringify(rec));
  setLogger(null);
})();
`;

test('a panic on a runtime thread goes to the logger, not stderr', { timeout: 120_000 }, () => {
  const child = spawnSync(process.execPath, ['-e', CHILD], { encoding: 'utf8', timeout: 110_000 });
  assert.equal(child.status, 0, child.stderr);
  assert.match(child.stdout, /task ended: task \d+ panicked/, child.stdout);
  assert.equal(child.stderr, '');
  assert.match(child.stdout, /logged: .*"level":"error".*ferrolock bug: panicked at/, child.stdout);
});
