'use strict';
// AbortSignals: the lock's own (aborted on loss) and the caller's (stops a wait). A loss is
// real: the key is deleted on the redis-server behind the holder's back and the watchdog's
// next renewal finds its token gone.
const test = require('node:test');
const assert = require('node:assert/strict');
const { setTimeout: sleep } = require('node:timers/promises');
const { Server } = require('./redis');
const { LockManager, withLock, LockLostError, AbortError } = require('..');

const T = { timeout: 60_000 };
let server;
test.before(async () => {
  server = await Server.start();
});
test.after(() => server?.stop());

/** Polls `lock.status` (the core's view, no event loop involved) until it is 'lost'. */
async function untilLost(lock) {
  const deadline = Date.now() + 30_000;
  while (lock.status !== 'lost') {
    assert.ok(Date.now() < deadline, `the watchdog never saw ${lock.key} deleted`);
    await sleep(20);
  }
}

test('lock.signal read for the first time after the loss is already aborted (throwIfAborted throws)', T, async () => {
  const m = new LockManager({ nodes: [server.url], ttl: 1_500 });
  try {
    const lock = await m.acquire('sig:first-read');
    server.cli('DEL', 'sig:first-read');
    await untilLost(lock);
    const signal = lock.signal;
    assert.equal(signal.aborted, true, 'status says lost but the signal is not aborted');
    assert.ok(signal.reason instanceof LockLostError, String(signal.reason));
    assert.match(signal.reason.message, /sig:first-read/);
    assert.throws(() => lock.signal.throwIfAborted(), (e) => e === signal.reason);
  } finally {
    await m.close();
  }
});

test('a signal read before the loss is aborted by the time status says lost', T, async () => {
  const m = new LockManager({ nodes: [server.url], ttl: 1_500 });
  try {
    const lock = await m.acquire('sig:early-read');
    const signal = lock.signal;
    assert.equal(signal.aborted, false);
    server.cli('DEL', 'sig:early-read');
    await untilLost(lock);
    assert.equal(signal.aborted, true, 'status says lost but the signal is not aborted');
    assert.ok(signal.reason instanceof LockLostError);
  } finally {
    await m.close();
  }
});

test("the README's pattern in withLock: throwIfAborted after a loss rejects with the LockLostError", T, async () => {
  let thrown;
  const rejection = await withLock(
    'sig:readme',
    async (lock) => {
      server.cli('DEL', 'sig:readme');
      await untilLost(lock);
      try {
        lock.signal.throwIfAborted();
      } catch (e) {
        thrown = e;
        throw e;
      }
      return 'not stopped';
    },
    { nodes: [server.url], ttl: 1_500 },
  ).then((v) => v, (e) => e);
  assert.ok(thrown instanceof LockLostError, `throwIfAborted did not throw (${String(thrown)})`);
  assert.ok(rejection instanceof LockLostError, String(rejection));
});

test('one AbortSignal shared by 12 waiting acquires: no MaxListenersExceededWarning, all abort, nothing left', T, async () => {
  const warnings = [];
  const onWarning = (w) => warnings.push(w);
  process.on('warning', onWarning);
  const nodes = [server.url];
  const holder = new LockManager({ nodes });
  const m = new LockManager({ nodes });
  try {
    const held = await holder.acquire('sig:shared');
    const controller = new AbortController();
    const waits = Array.from({ length: 12 }, () => m.acquire('sig:shared', { signal: controller.signal }).then(
      () => 'acquired',
      (e) => e,
    ));
    // Every acquire has registered on the signal by now (synchronously, in its call); the
    // warning would be emitted on the next tick.
    await sleep(50);
    controller.abort();
    for (const r of await Promise.all(waits)) assert.ok(r instanceof AbortError, String(r));
    await held.release();
    await new Promise((r) => setImmediate(r));
    const names = warnings.map((w) => `${w.name}: ${w.message}`);
    assert.deepEqual(names.filter((n) => /MaxListeners/.test(n)), []);
    const again = await m.tryAcquire('sig:shared');
    await again.release();
  } finally {
    process.off('warning', onWarning);
    await m.close();
    await holder.close();
  }
});
