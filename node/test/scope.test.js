'use strict';
// The reentrancy owner in Node is the withLock scope (its AsyncLocalStorage context): what
// tasks started inside a scope own while it lasts, and after it ended.
const test = require('node:test');
const assert = require('node:assert/strict');
const { Server } = require('./redis');
const { runNode } = require('./child');
const { LockManager, withLock, NotAcquiredError } = require('..');

const T = { timeout: 60_000 };
let server;
test.before(async () => {
  server = await Server.start();
});
test.after(() => server?.stop());

/** Resolves with what `start()` resolves to, started from a timer set now (in this async
 * context) that runs only once `gate` has resolved. */
function detached(gate, start) {
  return new Promise((resolve) => setTimeout(() => resolve(gate.then(start)), 0));
}

for (const reentrant of [false, true]) {
  test(`a task started inside withLock (reentrant: ${reentrant}) that runs after the scope ended acquires as a new owner`, T, async () => {
    const nodes = [server.url];
    const key = `scope:detached:${reentrant}`;
    let ended;
    const gate = new Promise((r) => {
      ended = r;
    });
    let later;
    let outerToken;
    await withLock(
      key,
      async (lock) => {
        outerToken = lock.token;
        later = detached(gate, () =>
          withLock(key, async (l) => ({ status: l.status, token: l.token, onServer: server.exists(key) }), {
            nodes,
            reentrant,
            wait: 30_000,
          }).catch((e) => e),
        );
      },
      { nodes, reentrant },
    );
    assert.ok(!server.exists(key), 'the outer scope did not release');
    ended();
    const r = await later;
    assert.ok(!(r instanceof Error), `the ended scope still owned the key: ${r}`);
    assert.equal(r.status, 'held');
    assert.ok(r.onServer);
    assert.notEqual(r.token, outerToken, 'the task re-entered as the ended scope');
    assert.ok(!server.exists(key));
  });
}

test('while the scope lasts, a task it started is that scope: reentrant re-enters, concurrent children included', T, async () => {
  const nodes = [server.url];
  const key = 'scope:children';
  const seen = await withLock(
    key,
    async (outer) => {
      let inside = 0;
      let most = 0;
      let release;
      const barrier = new Promise((r) => {
        release = r;
      });
      const children = Array.from({ length: 3 }, () =>
        withLock(
          key,
          async (l) => {
            inside += 1;
            most = Math.max(most, inside);
            if (inside === 3) release();
            await barrier;
            inside -= 1;
            return l.token;
          },
          { nodes, reentrant: true, wait: 30_000 },
        ),
      );
      const tokens = await Promise.all(children);
      // Another owner (a LockManager acquire outside any scope's key) is still excluded.
      const other = new LockManager({ nodes });
      await assert.rejects(other.acquire(key, { reentrant: true, wait: 0 }), NotAcquiredError);
      await other.close();
      return { tokens, most, outer: outer.token };
    },
    { nodes, reentrant: true },
  );
  assert.equal(seen.most, 3, 'the three children did not hold at once');
  assert.deepEqual(seen.tokens, [seen.outer, seen.outer, seen.outer]);
  assert.ok(!server.exists(key));
});

test('inside a scope whose lock was lost, its key may be acquired again (it waits for whoever holds it, not for itself)', T, async () => {
  const nodes = [server.url];
  const key = 'scope:lost';
  let inner;
  const outer = await withLock(
    key,
    async (lock) => {
      server.cli('DEL', key);
      await assert.rejects(lock.extend(), (e) => e.code === 'LOCK_LOST');
      assert.equal(lock.status, 'lost');
      inner = await withLock(key, async (l) => l.status, { nodes, wait: 5000 }).catch((e) => e);
    },
    { nodes },
  ).catch((e) => e);
  assert.equal(inner, 'held', String(inner));
  // The outer scope still ends with its loss reported.
  assert.ok(outer instanceof Error && outer.code === 'LOCK_LOST', String(outer));
  assert.equal(server.cli('EXISTS', key), '0');
});

test('inside a scope whose lock was released early, its key may be acquired again', T, async () => {
  const nodes = [server.url];
  const key = 'scope:released';
  const inner = await withLock(
    key,
    async (lock) => {
      assert.equal(await lock.release(), true);
      return withLock(key, async (l) => l.status, { nodes, wait: 5000 }).catch((e) => e);
    },
    { nodes },
  );
  assert.equal(inner, 'held', String(inner));
});

test('without reentrant, a task of a live scope asking for its key is refused at once', T, async () => {
  const nodes = [server.url];
  await withLock(
    'scope:live',
    async () => {
      const child = new Promise((resolve) => setTimeout(() => resolve(withLock('scope:live', async () => 'never', { nodes }).catch((e) => e)), 0));
      const r = await child;
      assert.ok(r instanceof NotAcquiredError && /already holds it/.test(r.message), String(r));
    },
    { nodes },
  );
});

// A job that schedules its next run from inside its own scope (a timer, setImmediate) runs
// that run in the scope's async context. Each new scope kept the ended one as its parent, so a
// recurring job kept every earlier scope, and its Lock, for the life of the process (about 2 KB
// a run, found at 8000 runs: none collected), and each acquire walked them all. The same when
// each run starts the next while it still holds its own key (a pipeline): the chain went through
// every earlier stage. Checked in a child process: the Locks of the earlier runs are collected
// while the job still runs.
for (const pattern of ['recurring', 'pipeline']) {
  test(`a ${pattern} job that starts its next run inside its withLock scope does not keep the earlier scopes`, T, async () => {
    const script = `
      require('node:v8').setFlagsFromString('--expose-gc');
      const gc = require('node:vm').runInNewContext('gc');
      const { withLock } = require('.');
      const nodes = [${JSON.stringify(server.url)}];
      const pipeline = ${JSON.stringify(pattern)} === 'pipeline';
      const RUNS = 60;
      let collected = 0;
      const registry = new FinalizationRegistry(() => { collected++; });
      let runs = 0;
      // A pipeline run waits, holding its key, until the next run holds the other key.
      let announce = () => {};
      function run() {
        const n = runs++;
        const previous = announce;
        const key = pipeline ? 'scope:chain:p' + (n % 2) : 'scope:chain:r';
        withLock(key, async (lock) => {
          registry.register(lock, n);
          previous();
          if (n + 1 < RUNS) {
            if (!pipeline) {
              setImmediate(run);
              return;
            }
            await new Promise((started) => {
              announce = started;
              setImmediate(run);
            });
            return;
          }
          for (let i = 0; i < 20 && collected < RUNS - 5; i++) {
            gc();
            await new Promise((r) => setTimeout(r, 50));
          }
          console.log('collected', collected, 'of', RUNS - 1);
        }, { nodes, wait: 30000 }).catch((e) => { console.log('failed', e.message); process.exit(1); });
      }
      run();
    `;
    const r = await runNode(script, { limitMs: 50_000 });
    assert.equal(r.code, 0, r.out + r.err);
    const m = /collected (\d+) of (\d+)/.exec(r.out);
    assert.ok(m, r.out + r.err);
    // All but the last few (still referenced by the run in progress) are collectable.
    assert.ok(Number(m[1]) >= Number(m[2]) - 5, `only ${m[1]} of the ${m[2]} earlier runs' Locks were collected: their scopes are kept`);
  });
}

// Redis takes keys up to 512 MB: the core shows a key over 128 bytes by its start and its
// length, and the wrapper's own messages must too, not repeat a megabyte.
test("the wrapper's own messages show a very long key by its start and length", T, async () => {
  const nodes = [server.url];
  const key = 'k'.repeat(1 << 20);
  const shown = `"${'k'.repeat(64)}…" (1048576 bytes)`;
  // A megabyte's round trip on a loaded machine outlasted the default node timeout (200 ms):
  // the release failed with QuorumUnreachableError before any message was checked.
  const slow = { nodes, ttl: 60_000, nodeTimeout: 5_000 };
  const m = new LockManager(slow);
  try {
    const errors = [];
    errors.push(await m.acquire(key, { ttl: -1 }).catch((e) => e));
    errors.push(await m.acquire(key, { signal: AbortSignal.abort() }).catch((e) => e));
    errors.push(await withLock(key, 'not a function', slow).catch((e) => e));
    errors.push(
      await withLock(
        key,
        () => new Promise((resolve) => setTimeout(() => resolve(withLock(key, async () => 'never', slow).catch((e) => e)), 0)),
        slow,
      ),
    );
    for (const e of errors) {
      assert.ok(e instanceof Error, String(e).slice(0, 300));
      assert.ok(e.message.length < 1000 && e.message.includes(shown), e.message.slice(0, 300));
    }
    // One UTF-8 cannot carry (a lone surrogate), refused before it reaches the core.
    const lone = await m.acquire(`${key}\ud800`).catch((e) => e);
    assert.ok(lone instanceof Error && /not valid Unicode/.test(lone.message), String(lone).slice(0, 300));
    assert.ok(lone.message.length < 1000 && lone.message.includes(`"${'k'.repeat(64)}…" (`), lone.message.slice(0, 300));
    // A short key is shown whole, as ever.
    assert.match((await m.acquire('k\ud800').catch((e) => e)).message, /^lock key "k\\ud800" is not valid Unicode/);
    const short = await m.acquire('short', { ttl: -1 }).catch((e) => e);
    assert.match(short.message, /^lock "short": /);
  } finally {
    await m.close();
  }
});
