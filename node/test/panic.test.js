'use strict';
// A panic inside the library reaches the logger, never stderr. `__panicForTest` is a hidden
// native function (not exported by index.js) that panics on one of the core's runtime
// threads; nothing in the library panics on purpose. It runs in a child process so its stderr
// can be read whole.
const test = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const path = require('node:path');
const { servers } = require('./redis');

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

// A panic inside a call on the JavaScript thread (a synchronous napi function) and one inside
// an async call's future: each becomes an error of kind PANIC (a LockError once converted, as
// every native error is), an acquire waiting meanwhile is granted once its holder releases,
// the process goes on, and a lock is acquired and released after.
const ERRORS_CHILD = `
const { LockManager, LockError, setLogger } = require(${JSON.stringify(path.resolve(__dirname, '..'))});
const native = require(${JSON.stringify(path.resolve(__dirname, '..', 'lib', 'native'))});
const { fromNative } = require(${JSON.stringify(path.resolve(__dirname, '..', 'lib', 'errors'))});
const logged = [];
setLogger((rec) => logged.push(rec));
const show = (place, e) => {
  const err = fromNative(e);
  console.log(place, 'threw', err instanceof LockError, err.code, JSON.stringify(err.message));
};
(async () => {
  try {
    native.__panicForTest('sync');
    console.log('sync returned');
  } catch (e) {
    show('sync', e);
  }
  // A call in flight while another panics (every call is polled in one task of the core's
  // runtime): an acquire waiting behind a holder, granted once the holder releases.
  const holder = new LockManager({ nodes: [process.env.FERROLOCK_NODES] });
  const held = await holder.acquire('panic:busy');
  const waiter = new LockManager({ nodes: [process.env.FERROLOCK_NODES] });
  const waiting = waiter.acquire('panic:busy');
  try {
    await native.__panicForTest('async');
    console.log('async resolved');
  } catch (e) {
    show('async', e);
  }
  await held.release();
  const granted = await waiting;
  console.log('waiter after the panic:', granted.status, await granted.release());
  await holder.close();
  await waiter.close();
  const m = new LockManager({ nodes: [process.env.FERROLOCK_NODES] });
  const lock = await m.acquire('panic:after');
  console.log('after:', lock.status, await lock.release());
  await m.close();
  // The panics' records went to the logger (from a library thread for the async one).
  while (logged.filter((r) => r.message.includes('__panicForTest was called (')).length < 2) {
    await new Promise((r) => setTimeout(r, 10));
  }
  console.log('logged both');
  setLogger(null);
})();
`;

test('a panic in a synchronous call and in an async call is an error of kind PANIC; a call in flight and the process go on', { timeout: 120_000 }, async () => {
  const [one] = await servers(1);
  try {
    const child = spawnSync(process.execPath, ['-e', ERRORS_CHILD], {
      encoding: 'utf8',
      timeout: 110_000,
      env: { ...process.env, FERROLOCK_NODES: one.url },
    });
    assert.equal(child.signal, null, `the child died of ${child.signal}: ${child.stderr}`);
    assert.equal(child.status, 0, child.stderr);
    assert.match(child.stdout, /^sync threw true PANIC ".*__panicForTest was called \(sync\).*"$/m, child.stdout);
    assert.match(child.stdout, /^async threw true PANIC ".*__panicForTest was called \(async\).*"$/m, child.stdout);
    assert.match(child.stdout, /^waiter after the panic: held true$/m, child.stdout);
    assert.match(child.stdout, /^after: held true$/m, child.stdout);
    assert.match(child.stdout, /^logged both$/m, child.stdout);
    assert.equal(child.stderr, '');
  } finally {
    await one.stop();
  }
});
