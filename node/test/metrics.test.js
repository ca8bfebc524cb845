'use strict';
// metrics() and prometheusText(): the core's counts after a scripted sequence of operations
// on a real redis-server. The key prefix is this file's own, so counts from elsewhere in the
// process (none: each test file runs in a process of its own) cannot mix in.
const test = require('node:test');
const assert = require('node:assert/strict');
const { servers } = require('./redis');
const ferrolock = require('..');
const { LockManager, withLock, NotAcquiredError, metrics, prometheusText } = ferrolock;

let one;
test.before(async () => {
  [one] = await servers(1);
});
test.after(() => one?.stop());

test('metrics() and prometheusText() count a scripted sequence', { timeout: 60_000 }, async () => {
  assert.equal(metrics()['metrics-node'], undefined);
  const nodes = [one.url];
  const m = new LockManager({ nodes });
  try {
    const a = await m.acquire('metrics-node:1');
    await assert.rejects(m.tryAcquire('metrics-node:1'), NotAcquiredError);
    assert.equal(await a.release(), true);
    assert.equal(await withLock('metrics-node:2', async () => 7, { nodes }), 7);
  } finally {
    await m.close();
  }
  const p = metrics()['metrics-node'];
  assert.ok(p, `no metrics-node prefix in ${Object.keys(metrics())}`);
  assert.equal(p.attempts, 3);
  assert.equal(p.grants, 2);
  assert.deepEqual(p.failures, { NOT_ACQUIRED: 1 });
  assert.deepEqual(p.losses, {});
  assert.equal(p.handoffs, 0);
  assert.equal(p.renewalFailures, 0);
  for (const h of [p.wait, p.hold]) {
    assert.equal(h.count, 2);
    assert.equal(h.le.length, h.cumulative.length);
    assert.equal(h.le.at(-1), Infinity);
    assert.equal(h.cumulative.at(-1), 2);
    assert.ok(h.sum >= 0);
  }
  const text = prometheusText();
  assert.match(text, /^ferrolock_grants_total\{prefix="metrics-node"\} 2$/m);
  assert.match(text, /^ferrolock_acquire_failures_total\{prefix="metrics-node",code="NOT_ACQUIRED"\} 1$/m);
  assert.match(text, /^ferrolock_hold_seconds_count\{prefix="metrics-node"\} 2$/m);
  assert.match(text, /^# TYPE ferrolock_wait_seconds histogram$/m);
});

test("a key prefix that is an Object.prototype name (__proto__) is a prefix like any other, not the result's prototype", { timeout: 60_000 }, async () => {
  const nodes = [one.url];
  assert.equal(await withLock('__proto__:1', async () => 7, { nodes }), 7);
  assert.equal(await withLock('toString:1', async () => 7, { nodes }), 7);
  const all = metrics();
  assert.equal(Object.getPrototypeOf(all), Object.prototype);
  assert.ok(Object.keys(all).includes('__proto__'), `no __proto__ prefix in ${Object.keys(all)}`);
  const p = Object.getOwnPropertyDescriptor(all, '__proto__').value;
  assert.equal(p.grants, 1);
  assert.equal(all.toString.grants, 1);
  assert.match(prometheusText(), /^ferrolock_grants_total\{prefix="__proto__"\} 1$/m);
});

test('the ESM entry exports metrics and prometheusText', { timeout: 60_000 }, async () => {
  const esm = await import('../index.mjs');
  assert.equal(esm.metrics, metrics);
  assert.equal(esm.prometheusText, prometheusText);
  assert.equal(typeof esm.default.metrics, 'function');
});
