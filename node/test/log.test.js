'use strict';
// setLogger: the core's log records reach JavaScript. The record comes from a real loss: the
// lock's key is deleted on the redis-server behind the holder's back, the watchdog's next
// renewal finds it gone, and the core logs the loss as a warning before it aborts the
// lock's signal. Each test file runs in a process of its own, so the process-wide logger set
// here is not shared with other files.
const test = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const path = require('node:path');
const { Server } = require('./redis');
const { LockManager, withLock, setLogger, InvalidArgumentError } = require('..');

const T = { timeout: 60_000 };
let server;
test.before(async () => {
  server = await Server.start();
});
test.after(() => {
  setLogger(null);
  server?.stop();
});

/** Takes `key` with a short ttl, deletes it on the server, and resolves once the lock's signal
 * has aborted (the core has logged the loss by then: the warning precedes the abort). */
async function loseLock(m, key) {
  const lock = await m.acquire(key);
  assert.ok(server.exists(key), 'the lock is on the server');
  const aborted = new Promise((r) => lock.signal.addEventListener('abort', r, { once: true }));
  server.cli('DEL', key);
  await aborted;
  assert.equal(lock.status, 'lost');
  return lock;
}

test('a lost lock reaches the setLogger function as a warning naming the key', T, async () => {
  const records = [];
  let seen;
  const arrived = new Promise((r) => {
    seen = r;
  });
  setLogger((rec) => {
    records.push(rec);
    if (rec.message.includes('log-node:lost')) seen(rec);
  });
  const m = new LockManager({ nodes: [server.url], ttl: 1_500 });
  try {
    await loseLock(m, 'log-node:lost');
    const rec = await arrived;
    assert.equal(rec.level, 'warn');
    assert.match(rec.target, /^ferrolock/);
    assert.match(rec.message, /log-node:lost/);
  } finally {
    await m.close();
  }
});

test('a level above the record keeps it away, and a replaced function is never called again', T, async () => {
  const first = [];
  setLogger((rec) => first.push(rec), { level: 'error' });
  const m = new LockManager({ nodes: [server.url], ttl: 1_500 });
  try {
    await loseLock(m, 'log-node:filtered');
    // The same function at 'warn' for a second loss: once that record has arrived, one for
    // the first loss (logged before the first abort) would have arrived before it.
    const second = [];
    let seen;
    const arrived = new Promise((r) => {
      seen = r;
    });
    setLogger(
      (rec) => {
        second.push(rec);
        if (rec.message.includes('log-node:second')) seen();
      },
      { level: 'warn' },
    );
    await loseLock(m, 'log-node:second');
    await arrived;
    assert.deepEqual(first, [], 'nothing reached the function set to errors only');
    assert.equal(second.filter((r) => r.message.includes('log-node:filtered')).length, 0);

    // null: the third loss reaches no function (the replaced one included).
    setLogger(null);
    await loseLock(m, 'log-node:off');
    const fourth = new Promise((r) => {
      setLogger((rec) => {
        second.push(rec);
        if (rec.message.includes('log-node:fourth')) r();
      });
    });
    await loseLock(m, 'log-node:fourth');
    await fourth;
    assert.equal(second.filter((r) => r.message.includes('log-node:off')).length, 0);
  } finally {
    await m.close();
  }
});

test("a withLock scope's own warning goes to the logger too", T, async () => {
  const records = [];
  setLogger((rec) => records.push(rec));
  {
    // The body fails and the lock is gone by the time of the release: the body's error
    // stands and the failed release is a warning (the host layer's decision table).
    await assert.rejects(
      withLock(
        'log-node:scope',
        async () => {
          server.cli('DEL', 'log-node:scope');
          throw new Error('body failed');
        },
        { nodes: [server.url], ttl: 10_000, watchdog: false },
      ),
      /body failed/,
    );
    const scoped = records.filter((r) => r.target === 'ferrolock::scope');
    assert.equal(scoped.length, 1, JSON.stringify(records));
    assert.equal(scoped[0].level, 'warn');
    assert.match(scoped[0].message, /log-node:scope/);
  }
});

test('a lock lost at maxHold names maxHold as JavaScript spells it: in withLock\'s rejection, lock.signal\'s reason and the logger\'s record, as in extend\'s', T, async () => {
  const records = [];
  setLogger((rec) => records.push(rec));
  try {
    const nodes = [server.url];
    let reason;
    await assert.rejects(
      withLock(
        'log-node:maxhold',
        async (lock) => {
          await new Promise((r) => lock.signal.addEventListener('abort', r, { once: true }));
          reason = lock.signal.reason;
          await assert.rejects(lock.extend(), (e) => {
            assert.match(e.message, /maxHold=300ms reached/);
            return true;
          });
        },
        { nodes, ttl: 10_000, maxHold: 300 },
      ),
      (e) => {
        assert.equal(e.code, 'LOCK_LOST');
        assert.match(e.message, /lost: maxHold=300ms reached/);
        return true;
      },
    );
    assert.match(reason.message, /lost: maxHold=300ms reached/);
    // The record comes on a path of its own (the logger's threadsafe function).
    for (const end = Date.now() + 20_000; !records.some((r) => r.message.includes('log-node:maxhold')); ) {
      assert.ok(Date.now() < end, `no record of the loss: ${JSON.stringify(records)}`);
      await new Promise((r) => setTimeout(r, 20));
    }
    const logged = records.filter((r) => r.message.includes('log-node:maxhold'));
    for (const r of logged) assert.doesNotMatch(r.message, /max_hold/);
  } finally {
    setLogger(null);
  }
});

test('bad arguments name the bad value', () => {
  assert.throws(() => setLogger('console.log'), (e) => e instanceof InvalidArgumentError && /"console.log"/.test(e.message));
  assert.throws(() => setLogger(() => {}, { level: 'WARNING' }), (e) => e instanceof InvalidArgumentError && /"WARNING"/.test(e.message));
  assert.throws(() => setLogger(() => {}, 5), (e) => e instanceof InvalidArgumentError && /5/.test(e.message));
  // A misspelt option, or options that are not an object of options, would leave the level at
  // 'warn' without a word: the caller who asked for 'debug' would see no debug record.
  const before = [];
  setLogger((r) => before.push(r), { level: 'error' });
  try {
    assert.throws(() => setLogger(() => {}, { levle: 'debug' }), (e) => e instanceof InvalidArgumentError && /unknown option "levle" \(the only option is level\)/.test(e.message));
    assert.throws(() => setLogger(() => {}, { level: 'debug', verbose: true }), (e) => e instanceof InvalidArgumentError && /unknown option "verbose"/.test(e.message));
    assert.throws(() => setLogger(() => {}, new Map([['level', 'debug']])), (e) => e instanceof InvalidArgumentError && /Map/.test(e.message));
    assert.throws(() => setLogger(() => {}, ['debug']), (e) => e instanceof InvalidArgumentError && /array/.test(e.message));
  } finally {
    setLogger(null);
  }
});

test('by default a warning is a process warning, and a logger never keeps the process alive', T, () => {
  // A child process: its own default logger. It loses a lock and exits on its own once the
  // warning was printed, with the logger still set (a weak threadsafe function).
  const script = `
    const { LockManager } = require(${JSON.stringify(path.resolve(__dirname, '..'))});
    const { execFileSync } = require('node:child_process');
    (async () => {
      const m = new LockManager({ nodes: [${JSON.stringify(server.url)}], ttl: 1500 });
      const lock = await m.acquire('log-node:default');
      const aborted = new Promise((r) => lock.signal.addEventListener('abort', r, { once: true }));
      execFileSync('redis-cli', ['-p', '${server.port}', 'DEL', 'log-node:default']);
      await aborted;
      await m.close();
    })();
  `;
  const r = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 50_000 });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stderr, /FerrolockWarning: .*log-node:default/);
});

test("a worker that loaded ferrolock first and exited does not take the main thread's default warnings with it", T, () => {
  const pkg = JSON.stringify(path.resolve(__dirname, '..'));
  const script = `
    const { Worker } = require('node:worker_threads');
    const { execFileSync } = require('node:child_process');
    (async () => {
      const w = new Worker(${JSON.stringify(`require(${pkg})`)}, { eval: true });
      await new Promise((resolve, reject) => { w.once('exit', resolve); w.once('error', reject); });
      const { LockManager } = require(${pkg});
      const warned = new Promise((r) => process.on('warning', (w) => w.name === 'FerrolockWarning' && /log-node:after-worker/.test(w.message) && r()));
      const m = new LockManager({ nodes: [${JSON.stringify(server.url)}], ttl: 1500 });
      const lock = await m.acquire('log-node:after-worker');
      const aborted = new Promise((r) => lock.signal.addEventListener('abort', r, { once: true }));
      execFileSync('redis-cli', ['-p', '${server.port}', 'DEL', 'log-node:after-worker']);
      await aborted;
      const deadline = new Promise((r) => setTimeout(() => r('none'), 20000));
      const got = await Promise.race([warned.then(() => 'warned'), deadline]);
      console.log(got);
      await m.close();
      process.exit(got === 'warned' ? 0 : 1);
    })();
  `;
  const r = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 50_000 });
  assert.equal(r.stdout.trim(), 'warned', `no FerrolockWarning on the main thread: ${r.stderr}`);
  assert.match(r.stderr, /FerrolockWarning: .*log-node:after-worker/);
});

test('a logger that throws neither crashes the process nor replaces withLock\'s result', T, async () => {
  const warned = [];
  const onWarning = (w) => {
    if (w.name === 'FerrolockWarning') warned.push(w.message);
  };
  process.on('warning', onWarning);
  setLogger(() => {
    throw new Error('logger broke');
  });
  const m = new LockManager({ nodes: [server.url], ttl: 1_500 });
  try {
    // A core record (the loss) with a throwing logger: no uncaught exception.
    await loseLock(m, 'log-node:throws');
    // A scope-end record of the binding's own (the key gone at release after the callback
    // failed): the callback's own error still comes out.
    await assert.rejects(
      withLock('log-node:throws-scope', async () => {
        server.cli('DEL', 'log-node:throws-scope');
        throw new Error('the body failed');
      }, { nodes: [server.url], watchdog: false }),
      /the body failed/,
    );
    const until = Date.now() + 20_000;
    while (warned.length < 2 && Date.now() < until) await new Promise((r) => setTimeout(r, 10));
    assert.ok(warned.length >= 2 && warned.every((w) => /logger broke/.test(w)), JSON.stringify(warned));
  } finally {
    process.off('warning', onWarning);
    setLogger(null);
    await m.close();
  }
});

test("a worker's withLock scope warning goes to the logger another thread set (or nowhere after setLogger(null)), not to a process warning", T, () => {
  // One logger per process, the last setLogger in any thread: the main thread sets it and a
  // worker's scope ends with a warning (its body failed and the key was gone at the release).
  const pkg = JSON.stringify(path.resolve(__dirname, '..'));
  const worker = `
    const { withLock } = require(${pkg});
    const { execFileSync } = require('node:child_process');
    withLock('log-node:worker-scope', async () => {
      execFileSync('redis-cli', ['-p', '${server.port}', 'DEL', 'log-node:worker-scope']);
      throw new Error('body failed');
    }, { nodes: [${JSON.stringify(server.url)}], watchdog: false }).catch((e) => console.log('worker:', e.message));
  `;
  for (const logger of ['function', 'null']) {
    const script = `
      const { Worker } = require('node:worker_threads');
      const { setLogger } = require(${pkg});
      const records = [];
      setLogger(${logger === 'null' ? 'null' : '(r) => records.push(r)'});
      const w = new Worker(${JSON.stringify(worker)}, { eval: true });
      w.once('exit', async () => {
        const deadline = Date.now() + 20000;
        while (${logger === 'null' ? 'false' : 'records.length === 0'} && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
        console.log(JSON.stringify(records.filter((r) => r.target === 'ferrolock::scope')));
      });
    `;
    const r = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 50_000 });
    assert.equal(r.status, 0, r.stderr);
    const lines = r.stdout.trim().split('\n');
    assert.equal(lines[0], 'worker: body failed', r.stdout);
    const scoped = JSON.parse(lines[1]);
    if (logger === 'function') {
      assert.equal(scoped.length, 1, `the main thread's logger got no scope record: ${r.stdout} ${r.stderr}`);
      assert.equal(scoped[0].level, 'warn');
      assert.match(scoped[0].message, /log-node:worker-scope/);
    } else {
      assert.equal(scoped.length, 0);
    }
    assert.doesNotMatch(r.stderr, /FerrolockWarning/, `setLogger(${logger}) in the main thread, yet the worker printed a process warning`);
  }
});

test("a worker's logger stops with the worker: the process's records go back to the logger the main thread set, or to the default warnings", T, async () => {
  const pkg = JSON.stringify(path.resolve(__dirname, '..'));
  // The worker's logger takes over: the worker loses a lock of its own and its function gets
  // that record before the worker ends (so the logger in effect was the worker's).
  const worker = `
    const { parentPort } = require('node:worker_threads');
    const { setLogger, LockManager } = require(${pkg});
    const { execFileSync } = require('node:child_process');
    (async () => {
      let seen;
      const got = new Promise((r) => { seen = r; });
      setLogger((r) => { if (r.message.includes('log-node:worker-own')) seen(); });
      const m = new LockManager({ nodes: [${JSON.stringify(server.url)}], ttl: 1500 });
      const lock = await m.acquire('log-node:worker-own');
      // The signal keeps the worker up until the loss (a logger does not).
      const aborted = new Promise((r) => lock.signal.addEventListener('abort', r, { once: true }));
      execFileSync('redis-cli', ['-p', '${server.port}', 'DEL', 'log-node:worker-own']);
      await aborted;
      const alive = setInterval(() => {}, 1000);
      await got;
      clearInterval(alive);
      await m.close();
      parentPort.postMessage('worker logged its loss');
    })();
  `;
  for (const main of ['default', 'setLogger']) {
    const script = `
      const { Worker } = require('node:worker_threads');
      const { setLogger, LockManager } = require(${pkg});
      const { execFileSync } = require('node:child_process');
      (async () => {
        let seen;
        const got = new Promise((r) => { seen = r; });
        ${main === 'setLogger'
          ? "setLogger((r) => { if (r.message.includes('log-node:main-after')) seen('main logger: ' + r.message); });"
          : "process.on('warning', (w) => { if (w.name === 'FerrolockWarning' && w.message.includes('log-node:main-after')) seen('process warning: ' + w.message); });"}
        const w = new Worker(${JSON.stringify(worker)}, { eval: true });
        w.on('message', (m) => console.log(m));
        await new Promise((resolve, reject) => { w.once('exit', resolve); w.once('error', reject); });
        console.log('worker exited');
        const m = new LockManager({ nodes: [${JSON.stringify(server.url)}], ttl: 1500 });
        const lock = await m.acquire('log-node:main-after');
        const aborted = new Promise((r) => lock.signal.addEventListener('abort', r, { once: true }));
        execFileSync('redis-cli', ['-p', '${server.port}', 'DEL', 'log-node:main-after']);
        await aborted;
        console.log('main lost its lock');
        // A logger does not keep the process up: this does, until the record comes.
        const alive = setInterval(() => {}, 1000);
        console.log(await got);
        clearInterval(alive);
        await m.close();
      })();
    `;
    // The limit is the test's: a record that never comes leaves the child waiting for it.
    const r = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 40_000 });
    const lines = r.stdout.trim().split('\n');
    assert.deepEqual(lines.slice(0, 3), ['worker logged its loss', 'worker exited', 'main lost its lock'], `${main}: ${r.stdout} ${r.stderr}`);
    assert.match(
      lines[3] ?? '',
      main === 'setLogger' ? /^main logger: .*log-node:main-after/ : /^process warning: .*log-node:main-after/,
      `${main}: the main thread's lost lock was logged nowhere after the worker that set the logger ended (${r.signal ?? r.status}): ${r.stdout} ${r.stderr}`,
    );
  }
});

test("setLogger refuses options that are not an object of options (a Promise: a missing await), naming what was given", () => {
  const kept = [];
  setLogger((r) => kept.push(r), { level: 'error' });
  try {
    const cases = [
      [Promise.resolve({ level: 'debug' }), /Promise/],
      [new Date(), /Date/],
      [/debug/, /RegExp/],
      [new String('debug'), /String/],
      [new Set(['debug']), /Set/],
      [new WeakMap(), /WeakMap/],
    ];
    for (const [options, named] of cases) {
      assert.throws(
        () => setLogger(() => {}, options),
        (e) => e instanceof InvalidArgumentError && /setLogger: options must be an object/.test(e.message) && named.test(e.message),
        `setLogger accepted ${Object.prototype.toString.call(options)} as options`,
      );
    }
  } finally {
    setLogger(null);
  }
});

test('an async logger that rejects neither crashes the process nor replaces withLock\'s result: its rejection is a process warning, as a throw is', T, () => {
  const pkg = JSON.stringify(path.resolve(__dirname, '..'));
  const script = `
    const { LockManager, withLock, setLogger } = require(${pkg});
    const { execFileSync } = require('node:child_process');
    const warned = [];
    process.on('warning', (w) => { if (w.name === 'FerrolockWarning') warned.push(w.message); });
    let calls = 0;
    setLogger(async () => {
      calls++;
      throw new Error('async logger broke');
    });
    (async () => {
      const m = new LockManager({ nodes: [${JSON.stringify(server.url)}], ttl: 1500 });
      // A core record (the loss).
      const lock = await m.acquire('log-node:async-rejects');
      const aborted = new Promise((r) => lock.signal.addEventListener('abort', r, { once: true }));
      execFileSync('redis-cli', ['-p', '${server.port}', 'DEL', 'log-node:async-rejects']);
      await aborted;
      // A scope-end record of the binding's own: the body's error still comes out.
      const result = await withLock('log-node:async-rejects-scope', async () => {
        execFileSync('redis-cli', ['-p', '${server.port}', 'DEL', 'log-node:async-rejects-scope']);
        throw new Error('the body failed');
      }, { nodes: [${JSON.stringify(server.url)}], watchdog: false }).catch((e) => e.message);
      console.log('withLock:', result);
      // Kept up until both rejections were reported (the test's limit bounds it).
      while (warned.filter((w) => /async logger broke/.test(w)).length < 2) await new Promise((r) => setTimeout(r, 20));
      console.log('logger called', calls, 'warned', warned.length);
      await m.close();
    })();
  `;
  const r = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 40_000 });
  assert.equal(r.status, 0, `the process ended with ${r.signal ?? r.status}: ${r.stdout} ${r.stderr}`);
  assert.match(r.stdout, /^withLock: the body failed$/m, r.stdout);
  assert.match(r.stdout, /^logger called 2 warned 2$/m, r.stdout + r.stderr);
  assert.match(r.stderr, /FerrolockWarning: the logger passed to setLogger (threw|rejected) on a warn record .*async logger broke/);
});

test('setLogger refuses level: null (off or the default? neither is said), naming it, as LockManager refuses null for an option that has no null', () => {
  try {
    assert.throws(
      () => setLogger(() => {}, { level: null }),
      (e) => e instanceof InvalidArgumentError && /level null is not one of 'error', 'warn'/.test(e.message) && /setLogger\(null\)/.test(e.message),
    );
  } finally {
    setLogger(null);
  }
});

test('setLogger refuses a class (it throws when called without new), naming it, rather than have every record fail in it', () => {
  const before = [];
  setLogger((r) => before.push(r), { level: 'error' });
  try {
    for (const cls of [class {}, class Sink {}, class extends Array {}]) {
      assert.throws(
        () => setLogger(cls),
        (e) => e instanceof InvalidArgumentError && /setLogger: expected a function or null, got a class/.test(e.message),
      );
    }
    assert.throws(() => setLogger(class Sink {}), /got a class Sink/);
  } finally {
    setLogger(null);
  }
});

// Records for a logger wait in a queue until its thread runs it. A worker's withLock scope
// ending with a warning (its body failed and the key was gone at the release) sends the record
// through that queue to the logger the main thread set: `count` such records, keys
// log-node:backlog:<tag>:0, 1, ... in order. The worker signals `flag` once every one is logged.
function backlogWorker(tag, count) {
  const pkg = JSON.stringify(path.resolve(__dirname, '..'));
  return `
    const { withLock } = require(${pkg});
    const { workerData } = require('node:worker_threads');
    const net = require('node:net');
    const sock = net.connect(${server.port}, '127.0.0.1');
    let answered;
    sock.on('data', () => answered());
    const del = (key) => new Promise((r) => {
      answered = r;
      sock.write('*2\\r\\n$3\\r\\nDEL\\r\\n$' + Buffer.byteLength(key) + '\\r\\n' + key + '\\r\\n');
    });
    (async () => {
      for (let i = 0; i < ${count}; i++) {
        const key = 'log-node:backlog:${tag}:' + i;
        await withLock(key, async () => { await del(key); throw new Error('body failed'); },
          { nodes: [${JSON.stringify(server.url)}], watchdog: false }).catch(() => {});
      }
      sock.destroy();
      Atomics.store(workerData.flag, 0, 1);
      Atomics.notify(workerData.flag, 0);
    })();
  `;
}

test('a logger whose thread is blocked gets at most 1000 queued records, the first ones, then a warning counting the rest, which were dropped', T, () => {
  // The main thread's event loop is blocked while a worker logs 1500 records for its logger:
  // every one waited in memory, without bound.
  const script = `
    const { Worker } = require('node:worker_threads');
    const { setLogger } = require(${JSON.stringify(path.resolve(__dirname, '..'))});
    const scoped = [];
    const reports = [];
    let done;
    setLogger((r) => {
      if (r.target === 'ferrolock::scope') scoped.push(Number(/backlog:blocked:(\\d+)/.exec(r.message)[1]));
      else if (/dropped/.test(r.message)) reports.push(r);
      // Every record delivered (as without a bound), or the kept ones and the count of the rest.
      if (scoped.length === 1500 || (reports.length > 0 && scoped.length === 1000)) done();
    });
    const finished = new Promise((r) => { done = r; });
    const flag = new Int32Array(new SharedArrayBuffer(4));
    new Worker(${JSON.stringify(backlogWorker('blocked', 1500))}, { eval: true, workerData: { flag } });
    Atomics.wait(flag, 0, 0);
    const keep = setInterval(() => {}, 1000);
    finished.then(() => {
      clearInterval(keep);
      console.log(JSON.stringify({ scoped, reports }));
    });
  `;
  const r = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 50_000 });
  assert.equal(r.status, 0, r.stderr);
  const { scoped, reports } = JSON.parse(r.stdout);
  assert.equal(scoped.length, 1000, `the blocked logger's queue held ${scoped.length} records`);
  assert.deepEqual(scoped, [...Array(1000).keys()], 'the first records are the ones kept');
  assert.equal(reports.length, 1, JSON.stringify(reports));
  assert.equal(reports[0].level, 'warn');
  assert.match(reports[0].message, /^500 log records dropped: the logger fell behind/);
});

test('an async logger whose promises have not settled gets at most 1000 records; once they settle, a warning counts the dropped ones', T, () => {
  const script = `
    const { Worker } = require('node:worker_threads');
    const { setLogger } = require(${JSON.stringify(path.resolve(__dirname, '..'))});
    const scoped = [];
    const reports = [];
    const unsettled = [];
    let check = () => {};
    setLogger((r) => {
      if (r.target === 'ferrolock::scope') scoped.push(r);
      else if (/dropped/.test(r.message)) reports.push(r);
      check();
      return new Promise((resolve) => unsettled.push(resolve));
    });
    const until = (cond) => new Promise((r) => { check = () => { if (cond()) r(); }; check(); });
    const keep = setInterval(() => {}, 1000);
    const flag = new Int32Array(new SharedArrayBuffer(4));
    const w = new Worker(${JSON.stringify(backlogWorker('async', 1500))}, { eval: true, workerData: { flag } });
    (async () => {
      await new Promise((r) => w.once('exit', r));
      // Every record is logged by now; at least 1000 reach the logger either way.
      await until(() => scoped.length >= 1000);
      const calledBeforeSettling = scoped.length;
      for (const resolve of unsettled.splice(0)) resolve();
      await until(() => scoped.length === 1500 || reports.length > 0);
      clearInterval(keep);
      console.log(JSON.stringify({ calledBeforeSettling, scoped: scoped.length, reports }));
    })();
  `;
  const r = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 50_000 });
  assert.equal(r.status, 0, r.stderr);
  const { calledBeforeSettling, scoped, reports } = JSON.parse(r.stdout);
  assert.equal(scoped, 1000, `the async logger was called ${scoped} times, ${calledBeforeSettling} of them before any of its promises settled`);
  assert.equal(reports.length, 1, JSON.stringify(reports));
  assert.match(reports[0].message, /^500 log records dropped: the logger fell behind/);
});
