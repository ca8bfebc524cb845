'use strict';
// A caller's AbortSignal that stops an acquire: the rejection comes only once nothing of the
// acquire is left on any node that answered. Against real redis-servers started here.
const test = require('node:test');
const assert = require('node:assert/strict');
const { execFileSync } = require('node:child_process');
const { setTimeout: sleep } = require('node:timers/promises');
const { servers } = require('./redis');
const { LockManager, AbortError } = require('..');

const T = { timeout: 120_000 };
let three;
test.before(async () => {
  three = await servers(3);
});
test.after(() => {
  for (const s of three) s?.stop();
});

/** How many keys on `server` have `part` in their name (the lock's and its queue's). */
function keysNamed(server, part) {
  const out = execFileSync('redis-cli', ['-p', String(server.port), '--scan', '--pattern', `*${part}*`], { encoding: 'utf8' });
  return out.split('\n').filter(Boolean).length;
}

async function until(what, cond, limitMs = 20_000) {
  for (const end = Date.now() + limitMs; !cond(); await sleep(20)) {
    if (Date.now() > end) throw new Error(`never happened: ${what}`);
  }
}

// The waiter's signal aborts just as the holder's release wakes it (its grant on its way):
// once the acquire has rejected, another manager's tryAcquire takes the key at once. Rejecting
// first and undoing after failed such a try in 12 of 177 tries.
// Three nodes: with one, the grant nearly always wins the race and is released by the caller.
test('an acquire aborted as it is granted leaves the key free once it rejects', T, async () => {
  const srv = three;
  const nodes = srv.map((s) => s.url);
  const [holder, waiter, other] = [1, 2, 3].map(() => new LockManager({ nodes, restartGuard: 0 }));
  let aborted = 0;
  try {
    for (let round = 0; round < 20; round++) {
      const key = `abort-granted:${process.pid}:${round}`;
      const held = await holder.acquire(key);
      const controller = new AbortController();
      const waiting = waiter.acquire(key, { signal: controller.signal }).then(
        (lock) => ({ lock }),
        (error) => ({ error }),
      );
      // Queued on every node (the key and its queue keys are there): the release wakes it.
      await until(`round ${round}: the waiter queued on every node`, () => srv.every((s) => keysNamed(s, key) >= 2));
      await held.release();
      controller.abort(new Error('stop'));
      const { lock, error } = await waiting;
      if (lock) {
        await lock.release();
      } else {
        assert.ok(error instanceof AbortError, `round ${round}: ${error}`);
        aborted++;
      }
      const taken = await other.tryAcquire(key).catch((e) => e);
      assert.ok(!(taken instanceof Error), `round ${round}: another manager's try right after the abort: ${taken}`);
      await taken.release();
    }
    assert.ok(aborted > 0, 'no round was aborted: the race never happened');
  } finally {
    await Promise.all([holder, waiter, other].map((m) => m.close()));
  }
});
