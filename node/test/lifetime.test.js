'use strict';
// Locks held when a process exits or a worker thread ends, checked on a real redis-server
// with redis-cli. Each scenario runs in a child process of its own, so the process-wide
// state it sets (the host layer's exiting flag, its registries, the exit hooks) never leaks
// into another test. Every lock has a 60 s ttl: a key gone within the test was released, not
// expired.
const test = require('node:test');
const assert = require('node:assert/strict');
const { servers } = require('./redis');
const { PKG, runNode: runChild } = require('./child');

const T = { timeout: 60_000 };
let one;
test.before(async () => {
  [one] = await servers(1);
});
test.after(() => one?.stop());

/** `runNode` with FERROLOCK_NODES set to this file's server. */
function runNode(script, options = {}) {
  return runChild(script, { ...options, env: { FERROLOCK_NODES: one.url } });
}

// A Lock the garbage collector takes unreleased is released (README). A scenario keeps every
// handle it checks in \`held\` (a worker: in its own \`globalThis.held\`), and \`run\` collects
// once the scenario's function has returned, before the line the test checks on, so a
// scenario that dropped a handle fails every time instead of when a collection happens to fall
// between its last line and the test's check (CI saw that twice: the handles of a returned
// async function, released after their status had read held).
const HEADER = `
  require('node:v8').setFlagsFromString('--expose-gc');
  const gc = require('node:vm').runInNewContext('gc');
  const { Worker, isMainThread, parentPort } = require('node:worker_threads');
  const { withLock, LockManager } = require(${JSON.stringify(PKG)});
  const held = [];
  /**
   * Runs the async \`scenario\`; once it has returned (its locals out of scope), a full
   * collection with time for the finalizers it queued (a dropped lock's release); then prints
   * \`marker\` and stays up until the test kills it.
   */
  function run(scenario, marker) {
    scenario()
      .then(async () => {
        gc();
        await new Promise((resolve) => setTimeout(resolve, 100));
        gc();
        await new Promise((resolve) => setTimeout(resolve, 100));
        console.log(marker);
        setInterval(() => {}, 1000);
      })
      .catch((e) => { console.log('failed', e.code, e.message); process.exit(1); });
  }
`;

test('process.exit() while holding locks (a manager\'s, a reentrant one, inside withLock) releases them all', T, async () => {
  const keys = ['life:exit:plain', 'life:exit:re', 'life:exit:with'];
  const script = `${HEADER}
    (async () => {
      const m = new LockManager({ ttl: 60000 });
      held.push(await m.acquire(${JSON.stringify(keys[0])}));
      held.push(await m.acquire(${JSON.stringify(keys[1])}, { reentrant: true }));
      await withLock(${JSON.stringify(keys[2])}, async (lock) => {
        lock.signal;
        console.log('held');
        process.exit(3);
      }, { ttl: 60000 });
    })();`;
  const r = await runNode(script);
  assert.equal(r.code, 3, r.err);
  assert.match(r.out, /held/);
  for (const k of keys) assert.ok(!one.exists(k), `${k} was left to its ttl at exit`);
});

test("a worker thread's locks are released when the main thread calls process.exit()", T, async () => {
  const body = `${HEADER}
    (async () => {
      const w = new Worker(\`
        const { parentPort } = require('node:worker_threads');
        const { LockManager } = require(${JSON.stringify(PKG)});
        (async () => {
          const m = new LockManager({ ttl: 60000 });
          globalThis.held = await m.acquire('life:main-exit:worker');
          parentPort.postMessage('held');
          setInterval(() => {}, 1000);
        })();\`, { eval: true });
      await new Promise((resolve, reject) => { w.once('message', resolve); w.once('error', reject); });
      console.log('worker holds');
      // Exits once the test has seen the worker's key.
      process.stdin.once('data', () => process.exit(0));
    })();`;
  let seen = false;
  const r = await runNode(body, {
    onLine: (line, child) => {
      if (line === 'worker holds') {
        seen = one.exists('life:main-exit:worker');
        child.stdin.write('exit\n');
      }
    },
  });
  assert.equal(r.code, 0, r.err);
  assert.ok(seen, 'the worker did not hold its lock before the exit');
  assert.ok(!one.exists('life:main-exit:worker'), "the worker's lock was left to its ttl");
});

test("a worker's own process.exit() releases that worker's locks only; the main thread keeps its lock and can acquire again", T, async () => {
  const body = `${HEADER}
    run(async () => {
      const mine = new LockManager({ ttl: 60000 });
      const kept = await mine.acquire('life:worker-exit:main');
      held.push(mine, kept);
      const w = new Worker(\`
        const { LockManager } = require(${JSON.stringify(PKG)});
        (async () => {
          const m = new LockManager({ ttl: 60000 });
          globalThis.held = [await m.acquire('life:worker-exit:worker'), await m.acquire('life:worker-exit:worker2', { reentrant: true })];
          process.exit(0);
        })();\`, { eval: true });
      const code = await new Promise((resolve, reject) => { w.once('exit', resolve); w.once('error', reject); });
      console.log('worker exited', code);
      console.log('main lock', kept.status);
      // The worker's exit is not the process's: acquires still work here.
      const again = await mine.acquire('life:worker-exit:after', { wait: 0 });
      console.log('acquired after', again.status);
      await again.release();
    }, 'done');`;
  // A server that restarted (no persistence) would have lost every key: told apart here.
  const runId = () => /run_id:(\w+)/.exec(one.cli('INFO', 'server'))[1];
  one.cli('DEL', 'life:worker-exit:main');
  const before = runId();
  // Every command the server runs, from any client or script: if the main key goes, the
  // failure names the command that deleted it (or shortened its ttl) and its client.
  const monitor = await one.monitor();
  let checked = null;
  const r = await runNode(body, {
    onLine: (line, child) => {
      if (line === 'done') {
        checked = {
          worker: one.exists('life:worker-exit:worker'),
          worker2: one.exists('life:worker-exit:worker2'),
          main: one.exists('life:worker-exit:main'),
        };
        child.kill('SIGKILL');
      }
    },
  });
  const onMain = (await monitor.stop()).filter((l) => l.includes('"life:worker-exit:main"'));
  const changed = onMain.filter((l) => /\] "(DEL|UNLINK|GETDEL|GETEX|RENAME|P?EXPIRE|P?EXPIREAT|PERSIST)"/i.test(l));
  const why = `\n${r.out}${r.err}\ncommands on the main key:\n${onMain.join('\n')}`;
  assert.match(r.out, /worker exited 0/, why);
  assert.match(r.out, /main lock held/, why);
  assert.match(r.out, /acquired after held/, why);
  assert.equal(runId(), before, 'the server restarted during the test');
  assert.deepEqual(changed, [], `a command changed the main thread's key${why}`);
  assert.deepEqual(checked, { worker: false, worker2: false, main: true }, why);
  // The worker's teardown released its locks before its objects were finalized: no warning of
  // a collected lock (that one is for a handle the program dropped while holding).
  assert.doesNotMatch(r.out + r.err, /garbage-collected/, why);
  one.cli('DEL', 'life:worker-exit:main');
});

test('a Lock the garbage collector takes unreleased is released with a warning naming its key; one still referenced is kept, one released is not warned of (README)', T, async () => {
  const body = `${HEADER}
    const { setLogger } = require(${JSON.stringify(PKG)});
    const collected = [];
    setLogger((rec) => {
      if (rec.message.includes('garbage-collected')) collected.push(rec);
    });
    run(async () => {
      const m = new LockManager({ ttl: 60000 });
      let dropped = await m.acquire('life:gc:dropped');
      const kept = await m.acquire('life:gc:kept');
      let released = await m.acquire('life:gc:released');
      await released.release();
      held.push(kept);
      dropped = null;
      released = null;
      // The release follows the collection on the core's runtime, and the warning reaches the
      // logger on this thread after it: poll until another acquire gets the key and the
      // warning has come (a bounded number of rounds; no time bound).
      let taken = null;
      for (let round = 0; round < 200 && (taken === null || collected.length === 0); round++) {
        gc();
        await new Promise((resolve) => setTimeout(resolve, 20));
        taken ??= await m.tryAcquire('life:gc:dropped').catch(() => null);
      }
      // More collections before the count: a warning wrongly given for the released lock
      // (dropped at the same time) would be here by now.
      for (let round = 0; round < 5; round++) {
        gc();
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      console.log(taken === null ? 'dropped still held' : 'dropped released');
      console.log('kept', kept.status);
      for (const rec of collected) console.log('warned', rec.level, rec.message);
    }, 'done');`;
  let keptExists = null;
  const r = await runNode(body, {
    onLine: (line, child) => {
      if (line === 'done') {
        keptExists = one.exists('life:gc:kept');
        child.kill('SIGKILL');
      }
    },
  });
  assert.match(r.out, /dropped released/, r.out + r.err);
  assert.match(r.out, /kept held/, r.out + r.err);
  assert.equal(keptExists, true, 'the referenced lock was released too');
  const warned = r.out.split('\n').filter((l) => l.startsWith('warned'));
  assert.equal(warned.length, 1, `one warning, for the collected held lock:\n${r.out}`);
  assert.match(warned[0], /^warned warn lock "life:gc:dropped" is released because its handle was garbage-collected while the lock was held/);
  assert.match(warned[0], /keep a reference to the lock until you release it, or hold it for a scope \(.*Node's withLock/);
  one.cli('DEL', 'life:gc:kept', 'life:gc:dropped');
});

test("a withLock whose callback awaits a promise nothing can settle is collected with a warning that says so, not one advising withLock", T, async () => {
  const body = `${HEADER}
    const { setLogger } = require(${JSON.stringify(PKG)});
    const collected = [];
    setLogger((rec) => {
      if (rec.message.includes('garbage-collected')) collected.push(rec);
    });
    run(async () => {
      const m = new LockManager({ ttl: 60000 });
      // Nothing references the promise the callback awaits (nor its resolve): the callback,
      // its scope and the lock go to the collector together. (Nothing is printed in the scope:
      // process.stdout, made at its first use, would keep the scope's async context, and so
      // the lock.)
      let entered = false;
      withLock('life:gc:scope', async () => {
        entered = true;
        await new Promise(() => {});
      }, { ttl: 60000 }).catch((e) => console.log('withLock failed', e.message));
      // Bounded rounds, no time bound: the key taken by another acquire proves the release.
      let taken = null;
      for (let round = 0; round < 200 && (taken === null || collected.length === 0); round++) {
        gc();
        await new Promise((resolve) => setTimeout(resolve, 20));
        taken ??= await m.tryAcquire('life:gc:scope').catch(() => null);
      }
      console.log(entered ? 'in scope' : 'the callback never ran');
      console.log(taken === null ? 'scope lock still held' : 'scope lock released');
      for (const rec of collected) console.log('warned', rec.level, rec.message);
      if (taken !== null) await taken.release();
    }, 'done');`;
  const r = await runNode(body, {
    onLine: (line, child) => {
      if (line === 'done') child.kill('SIGKILL');
    },
  });
  assert.match(r.out, /in scope/, r.out + r.err);
  assert.match(r.out, /scope lock released/, r.out + r.err);
  const warned = r.out.split('\n').filter((l) => l.startsWith('warned'));
  assert.equal(warned.length, 1, `one warning, for the scope's lock:\n${r.out}`);
  assert.match(warned[0], /^warned warn lock "life:gc:scope" is released because its handle was garbage-collected/);
  // The lock was in a withLock already: the advice to use one misleads. What went wrong is
  // what its callback was waiting for.
  assert.doesNotMatch(warned[0], /hold it for a scope/, warned[0]);
  assert.match(warned[0], /withLock/);
  assert.match(warned[0], /can never settle/, warned[0]);
});

test('a Lock the garbage collector takes while its work still watches its signal is released and aborts the signal (the work is told, as for any loss)', T, async () => {
  const body = `${HEADER}
    run(async () => {
      const m = new LockManager({ ttl: 60000 });
      let lock = await m.acquire('life:gc:signal');
      // The work keeps the signal, as a fetch or a loop given \`lock.signal\` does, and drops
      // the lock without releasing it.
      const signal = lock.signal;
      held.push(signal);
      lock = null;
      // Bounded rounds, no time bound: the release follows the collection on the core's
      // runtime, and the abort reaches this thread after it.
      let taken = null;
      for (let round = 0; round < 200 && (taken === null || !signal.aborted); round++) {
        gc();
        await new Promise((resolve) => setTimeout(resolve, 20));
        taken ??= await m.tryAcquire('life:gc:signal').catch(() => null);
      }
      console.log(taken === null ? 'dropped still held' : 'dropped released');
      console.log(signal.aborted ? \`reason \${signal.reason.code} \${signal.reason.message}\` : 'signal not aborted');
      if (taken !== null) await taken.release();
    }, 'done');`;
  const r = await runNode(body, {
    onLine: (line, child) => {
      if (line === 'done') child.kill('SIGKILL');
    },
  });
  assert.match(r.out, /dropped released/, r.out + r.err);
  assert.match(r.out, /^reason LOCK_LOST lock "life:gc:signal" is released because its handle was garbage-collected while the lock was held/m, r.out + r.err);
  one.cli('DEL', 'life:gc:signal');
});

test('a process killed by a signal with its default action leaves its locks to their ttl (documented)', T, async () => {
  const body = `${HEADER}
    run(async () => {
      const m = new LockManager({ ttl: 60000 });
      held.push(await m.acquire('life:killed'));
    }, 'held');`;
  const r = await runNode(body, { onLine: (line, child) => line === 'held' && child.kill('SIGTERM') });
  assert.equal(r.signal, 'SIGTERM');
  assert.ok(one.exists('life:killed'), 'expected the key to stay until its ttl');
  const pttl = Number(one.cli('PTTL', 'life:killed'));
  assert.ok(pttl > 0 && pttl <= 60_000, `PTTL ${pttl}`);
  one.cli('DEL', 'life:killed');
});

test("the README's handler turns SIGINT and SIGTERM into an exit, which releases", T, async () => {
  for (const sig of ['SIGINT', 'SIGTERM']) {
    const key = `life:handled:${sig}`;
    const body = `${HEADER}
      for (const s of ['SIGINT', 'SIGTERM']) process.on(s, () => process.exit(130));
      run(async () => {
        const m = new LockManager({ ttl: 60000 });
        held.push(await m.acquire(${JSON.stringify(key)}));
      }, 'held');`;
    const r = await runNode(body, { onLine: (line, child) => line === 'held' && child.kill(sig) });
    assert.equal(r.code, 130, `${sig}: ${JSON.stringify(r)}`);
    assert.ok(!one.exists(key), `${sig}: the key was left held`);
  }
});

// Issue 32: every promise settles through one threadsafe function per environment, referenced
// only while a promise is pending. These scripts have no handle of their own: only ferrolock's
// pending promise keeps them running.
test('a pending acquire keeps the process alive until it is granted', T, async () => {
  const key = 'life:pending';
  const { LockManager } = require(PKG);
  const holder = new LockManager({ nodes: [one.url], ttl: 60000 });
  const held = await holder.acquire(key);
  const body = `${HEADER}
    const m = new LockManager({ ttl: 60000 });
    m.acquire(${JSON.stringify(key)}).then(async (lock) => {
      console.log('acquired');
      await lock.release();
      await m.close();
      console.log('released');
    });
    console.log('waiting');`;
  let queued = null;
  const r = await runNode(body, {
    onLine: (line) => {
      if (line !== 'waiting') return;
      queued = (async () => {
        for (const end = Date.now() + 20_000; one.cli('ZCARD', `ferrolock:queue:{${key}}`) === '0'; ) {
          if (Date.now() > end) return false;
          await new Promise((resolve) => setTimeout(resolve, 20));
        }
        await held.release();
        return true;
      })();
    },
  });
  await holder.close();
  assert.equal(await queued, true, `the child never queued for the key: ${r.out}${r.err}`);
  assert.equal(r.code, 0, r.err);
  assert.match(r.out, /acquired\nreleased/, `the child exited while its acquire was pending: ${r.out}`);
  assert.ok(!one.exists(key));
});

test('a lock whose signal was read keeps the process alive until the loss, then it exits on its own', T, async () => {
  const key = 'life:watched';
  const body = `${HEADER}
    const m = new LockManager({ ttl: 3000 });
    m.acquire(${JSON.stringify(key)}).then((lock) => {
      held.push(lock);
      lock.signal.addEventListener('abort', () => console.log('lost'));
      console.log('held');
    });`;
  const r = await runNode(body, { onLine: (line) => line === 'held' && one.cli('DEL', key) });
  assert.equal(r.signal, null, 'the child did not exit on its own after the loss');
  assert.equal(r.code, 0, r.err);
  assert.match(r.out, /held\nlost/, `the child exited while its signal was watched: ${r.out}`);
});

// The scenario waits for the test's go (a line on stdin) before it fails, so the test has
// seen every key held first; then `fail` ends the process the way a caller's bug does.
const FAILS = {
  uncaught: "setTimeout(() => { throw new Error('caller bug'); }, 0);",
  unhandled: "Promise.reject(new Error('caller bug'));",
};
for (const [how, fail] of Object.entries(FAILS)) {
  test(`an ${how === 'uncaught' ? 'uncaught exception' : 'unhandled promise rejection'} ending the process while holding releases the locks (exit code 1)`, T, async () => {
    const keys = [`life:${how}:plain`, `life:${how}:with`];
    const body = `${HEADER}
      (async () => {
        const m = new LockManager({ ttl: 60000 });
        held.push(await m.acquire(${JSON.stringify(keys[0])}));
        await withLock(${JSON.stringify(keys[1])}, async (lock) => {
          console.log('held', held[0].token, lock.token);
          await new Promise((resolve) => process.stdin.once('data', resolve));
          ${fail}
          await new Promise(() => setInterval(() => {}, 1000));
        }, { ttl: 60000 });
      })();`;
    let tokens = null;
    const r = await runNode(body, {
      onLine: (line, child) => {
        if (!line.startsWith('held ')) return;
        tokens = keys.map((k) => one.cli('GET', k)).join(' ') === line.slice('held '.length);
        child.stdin.write('go\n');
      },
    });
    assert.equal(tokens, true, `the child did not hold both keys before failing: ${r.out}${r.err}`);
    assert.equal(r.signal, null, `the child hung after the failure: ${r.out}${r.err}`);
    assert.equal(r.code, 1, r.err);
    assert.match(r.err, /caller bug/);
    for (const k of keys) assert.ok(!one.exists(k), `${k} was left to its ttl by the ${how} failure`);
  });
}

// A worker that simply runs out of work (no release, the handle still referenced) or throws
// an uncaught error: its teardown releases its lock, and not the main thread's.
for (const how of ['ends', 'throws']) {
  test(`a worker thread that ${how === 'ends' ? 'runs out of work' : 'throws an uncaught error'} while holding releases its lock`, T, async () => {
    const key = `life:worker-${how}`;
    const body = `${HEADER}
      run(async () => {
        const mine = new LockManager({ ttl: 60000 });
        const kept = await mine.acquire(${JSON.stringify(`${key}:main`)});
        held.push(mine, kept);
        const w = new Worker(\`
          const { parentPort } = require('node:worker_threads');
          const { LockManager } = require(${JSON.stringify(PKG)});
          (async () => {
            const m = new LockManager({ ttl: 60000 });
            globalThis.held = await m.acquire(${JSON.stringify(key)});
            // The listener is the last thing keeping this thread's event loop alive.
            parentPort.once('message', () => {
              if (${JSON.stringify(how)} === 'throws') setTimeout(() => { throw new Error('worker bug'); }, 0);
            });
            parentPort.postMessage(globalThis.held.token);
          })();\`, { eval: true });
        const errors = [];
        w.on('error', (e) => errors.push(e.message));
        const token = await new Promise((resolve, reject) => { w.once('message', resolve); w.once('exit', reject); });
        console.log('worker holds', token);
        await new Promise((resolve) => process.stdin.once('data', resolve));
        w.postMessage('go');
        const code = await new Promise((resolve) => w.once('exit', resolve));
        console.log('worker exited', code, JSON.stringify(errors));
        console.log('main lock', kept.status);
      }, 'done');`;
    let heldBefore = null;
    let after = null;
    const r = await runNode(body, {
      onLine: (line, child) => {
        if (line.startsWith('worker holds ')) {
          heldBefore = one.cli('GET', key) === line.slice('worker holds '.length);
          child.stdin.write('go\n');
        } else if (line === 'done') {
          after = (async () => {
            // The release may land just after the worker's 'exit' event: poll (60 s ttl).
            for (const end = Date.now() + 20_000; one.exists(key) && Date.now() < end; ) {
              await new Promise((resolve) => setTimeout(resolve, 50));
            }
            const seen = { worker: one.exists(key), main: one.exists(`${key}:main`) };
            child.kill('SIGKILL');
            return seen;
          })();
        }
      },
    });
    const why = `\n${r.out}${r.err}`;
    assert.equal(heldBefore, true, `the worker did not hold its key${why}`);
    if (how === 'ends') assert.match(r.out, /worker exited 0 \[\]/, why);
    else assert.match(r.out, /worker exited 1 \["worker bug"\]/, why);
    assert.match(r.out, /main lock held/, why);
    assert.deepEqual(await after, { worker: false, main: true }, `the worker's lock was left to its ttl, or the main thread's was taken${why}`);
    one.cli('DEL', `${key}:main`);
  });
}

// console.log(lock), or an inspection that reads its getters (lock.signal among them, which
// watches for the loss), inside the callback, and a reference kept past it: the lock is
// released when withLock settles, nothing keeps the process up, and it exits on its own.
test('a lock logged, inspected (getters read) and kept referenced from its withLock callback is released when withLock settles, and the process exits on its own', T, async () => {
  const key = 'life:inspected';
  const body = `
    const util = require('node:util');
    const { withLock } = require(${JSON.stringify(PKG)});
    const { execFileSync } = require('node:child_process');
    (async () => {
      await withLock(${JSON.stringify(key)}, async (lock) => {
        console.log(lock);
        console.log(util.inspect(lock, { getters: true, showHidden: true, depth: 5 }));
        globalThis.kept = lock;
      }, { ttl: 60000 });
      const exists = execFileSync('redis-cli', ['-p', '${one.port}', 'EXISTS', ${JSON.stringify(key)}], { encoding: 'utf8' }).trim();
      console.log('after', globalThis.kept.status, exists);
    })();`;
  const r = await runNode(body);
  assert.equal(r.signal, null, `the child did not exit on its own: ${r.out}`);
  assert.equal(r.code, 0, r.err);
  assert.match(r.out, /\[signal\]: \[Getter\] AbortSignal \{ aborted: false \}/, `the inspection did not read the signal: ${r.out}`);
  assert.match(r.out, /^after released 0$/m, r.out);
  assert.ok(!one.exists(key));
});
