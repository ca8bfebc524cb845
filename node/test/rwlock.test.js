'use strict';
// The read-write lock from Node (issue 33): acquireRead/acquireWrite and withReadLock/
// withWriteLock over the lock's path, against a real redis-server started here.
const test = require('node:test');
const fs = require('node:fs');
const path = require('node:path');
const { execFileSync } = require('node:child_process');
const assert = require('node:assert/strict');
const { setTimeout: sleep } = require('node:timers/promises');
const { Server } = require('./redis');
const { PKG, runNode, startWorker } = require('./child');
const { LockManager, withLock, withReadLock, withWriteLock, AbortError, InvalidArgumentError, LockLostError, NotAcquiredError } = require('..');

const T = { timeout: 60_000 };
let server;
test.before(async () => {
  server = await Server.start();
});
test.after(() => server?.stop());

/** How many keys on the server have `part` in their name: the hash, read-hold keys, queue
 * keys. Not a release's latch (`ferrolock:latch:…`), which outlives the hold on purpose so a
 * re-sent release answers as the first did. */
function keysNamed(part) {
  const names = server.cli('--scan', '--pattern', `*${part}*`).split('\n').filter(Boolean);
  return names.filter((n) => !n.startsWith('ferrolock:latch:')).length;
}

async function until(what, cond, limitMs = 20_000) {
  for (const end = Date.now() + limitMs; !cond(); await sleep(20)) {
    if (Date.now() > end) throw new Error(`never happened: ${what}`);
  }
}

function managers(n) {
  return Array.from({ length: n }, () => new LockManager({ nodes: [server.url] }));
}

test('two readers hold one key at once', T, async () => {
  const [a, b] = managers(2);
  const key = 'rw:readers';
  const r1 = await a.acquireRead(key);
  const r2 = await b.tryAcquireRead(key);
  assert.equal(server.cli('HGET', key, 'mode'), 'read');
  assert.equal(Number(server.cli('HLEN', key)), 3, 'mode and one field per reader');
  await assert.rejects(b.tryAcquireWrite(key), NotAcquiredError);
  assert.equal(await r1.release(), true);
  assert.equal(await r2.release(), true);
  assert.equal(server.exists(key), false);
  await Promise.all([a.close(), b.close()]);
});

test('a writer excludes readers and writers until it releases', T, async () => {
  const [a, b] = managers(2);
  const key = 'rw:writer';
  const w = await a.acquireWrite(key);
  assert.equal(server.cli('HGET', key, 'mode'), 'write');
  await assert.rejects(b.tryAcquireRead(key), NotAcquiredError);
  await assert.rejects(b.tryAcquireWrite(key), NotAcquiredError);
  assert.equal(await w.release(), true);
  const r = await b.tryAcquireRead(key);
  assert.equal(await r.release(), true);
  await Promise.all([a.close(), b.close()]);
});

test('inside withReadLock a write on the same key is refused as an upgrade; a read under a write is a downgrade', T, async () => {
  const nodes = [server.url];
  const key = 'rw:upgrade';
  await withReadLock(
    key,
    async () => {
      await assert.rejects(withWriteLock(key, () => 'never', { nodes }), (e) => {
        assert.match(e.message, /read->write upgrade is refused/);
        assert.match(e.message, /rw:upgrade/);
        assert.equal(e.code, 'INVALID_ARGUMENT');
        return true;
      });
    },
    { nodes },
  );
  assert.equal(server.exists(key), false);
  const seen = await withWriteLock(
    key,
    () =>
      withReadLock(
        key,
        () => {
          // The same owner's field holds both sides.
          assert.equal(server.cli('HGET', key, 'mode'), 'write');
          assert.equal(Number(server.cli('HLEN', key)), 3);
          return 'downgraded';
        },
        { nodes },
      ),
    { nodes },
  );
  assert.equal(seen, 'downgraded');
  assert.equal(server.exists(key), false);
});

// Nested on the same key through another manager of the same servers (other connection
// options: another owner), a read or write is refused at once; the hint says what would re-enter
// instead. It told a read nested in a read to pass reentrant: true (a read-write lock takes no
// such flag), and a read nested in a withLock or a lock in a withReadLock to nest the enclosing
// kind, which never re-enters the other.
test('a read or write nested through another manager is refused with a hint that fits the pair', T, async () => {
  const nodes = [server.url];
  const other = { nodes: [`${server.url}/0`], wait: 30_000 };
  const key = 'rw:other-manager';
  const refusal = (outer, inner) => outer(key, () => inner(key, () => 'never', other), { nodes }).then(
    () => assert.fail('the nested acquire was granted'),
    (e) => {
      assert.ok(e instanceof NotAcquiredError && /same servers through another manager/.test(e.message), String(e));
      return e.message;
    },
  );
  for (const [outer, inner] of [[withReadLock, withReadLock], [withWriteLock, withReadLock], [withWriteLock, withWriteLock]]) {
    const message = await refusal(outer, inner);
    assert.match(message, /only a withReadLock or withWriteLock nested with the same connection options re-enters it/, message);
    assert.doesNotMatch(message, /reentrant/, message);
  }
  for (const [outer, inner] of [[withLock, withReadLock], [withReadLock, withLock]]) {
    const message = await refusal(outer, inner);
    assert.doesNotMatch(message, /re-enters it/, message);
  }
  assert.equal(server.exists(key), false);
});

test('a read ttl above 30 s is refused naming it; 30 s is granted', T, async () => {
  const [m] = managers(1);
  const key = 'rw:cap';
  await assert.rejects(m.acquireRead(key, { ttl: 31_000 }), (e) => {
    assert.ok(e instanceof InvalidArgumentError, String(e));
    assert.match(e.message, /31s/);
    return true;
  });
  await assert.rejects(withReadLock(key, () => {}, { nodes: [server.url], ttl: 31_000 }), InvalidArgumentError);
  assert.equal(server.exists(key), false);
  const r = await m.acquireRead(key, { ttl: 30_000 });
  assert.equal(await r.release(), true);
  await m.close();
});

test('fencing on a read is refused; writes get increasing fences', T, async () => {
  const [m] = managers(1);
  const key = 'rw:fence';
  await assert.rejects(m.acquireRead(key, { fencing: true }), (e) => {
    assert.ok(e instanceof InvalidArgumentError, String(e));
    assert.match(e.message, /fenc/);
    assert.match(e.message, /rw:fence/);
    return true;
  });
  const w1 = await m.acquireWrite(key, { fencing: true });
  const f1 = w1.fence;
  assert.equal(typeof f1, 'number');
  await w1.release();
  const f2 = await withWriteLock(key, (l) => l.fence, { nodes: [server.url], fencing: true });
  assert.ok(f2 > f1, `${f2} after ${f1}`);
  await m.close();
});

test('withReadLock releases when its callback throws', T, async () => {
  const key = 'rw:throw';
  const boom = new Error('boom');
  await assert.rejects(
    withReadLock(
      key,
      () => {
        assert.equal(server.cli('HGET', key, 'mode'), 'read');
        throw boom;
      },
      { nodes: [server.url] },
    ),
    (e) => e === boom,
  );
  assert.equal(keysNamed(key), 0);
  const [m] = managers(1);
  const w = await m.tryAcquireWrite(key);
  await w.release();
  await m.close();
});

test('a waiting read acquire aborted by its signal leaves nothing held', T, async () => {
  const [holder, waiter] = managers(2);
  const key = 'rw:abort';
  const w = await holder.acquireWrite(key);
  const before = keysNamed(key);
  const controller = new AbortController();
  const waiting = waiter.acquireRead(key, { signal: controller.signal }).then(
    (l) => l,
    (e) => e,
  );
  await until('the reader queued', () => keysNamed(key) > before);
  controller.abort(new Error('stop'));
  const got = await waiting;
  assert.ok(got instanceof AbortError, `expected an AbortError, got ${got}`);
  assert.equal(await w.release(), true);
  // Neither a read hold nor a queue entry of the aborted reader is left.
  assert.equal(keysNamed(key), 0);
  const other = await holder.tryAcquireWrite(key);
  await other.release();
  await Promise.all([holder.close(), waiter.close()]);
});

test('withWriteLock waiting behind a reader, aborted by its signal, leaves only the reader; its lock.signal is live inside', T, async () => {
  const nodes = [server.url];
  const [reader] = managers(1);
  const key = 'rw:abort-write';
  const r = await reader.acquireRead(key);
  const before = keysNamed(key);
  const controller = new AbortController();
  const waiting = withWriteLock(key, () => 'never', { nodes, signal: controller.signal }).then(
    (v) => v,
    (e) => e,
  );
  await until('the writer queued', () => keysNamed(key) > before);
  controller.abort(new Error('stop'));
  const got = await waiting;
  assert.ok(got instanceof AbortError, `expected an AbortError, got ${got}`);
  assert.equal(server.cli('HGET', key, 'mode'), 'read');
  assert.equal(keysNamed(key), before, 'only the reader\'s keys are left');
  assert.equal(await r.release(), true);
  const aborted = await withWriteLock(key, (lock) => lock.signal.aborted, { nodes });
  assert.equal(aborted, false);
  assert.equal(keysNamed(key), 0);
  await reader.close();
});

for (const side of ['read', 'write']) {
  test(`process exit while holding the ${side} side releases it`, T, async () => {
    const key = `rw:exit:${side}`;
    const take = side === 'read' ? 'withReadLock' : 'withWriteLock';
    const script = `
      const { ${take} } = require(${JSON.stringify(PKG)});
      ${take}(${JSON.stringify(key)}, async () => {
        console.log('held');
        process.exit(3);
      }, { ttl: 25000, nodes: [${JSON.stringify(server.url)}] });`;
    const r = await runNode(script);
    assert.equal(r.code, 3, r.err);
    assert.match(r.out, /held/);
    // A 25 s lease: only the exit can have released it.
    assert.equal(keysNamed(key), 0);
  });
}

test("a terminated worker thread's read and write holds are released", T, async () => {
  const { worker } = await startWorker(
    `const { parentPort } = require('node:worker_threads');
     const { LockManager } = require(${JSON.stringify(PKG)});
     (async () => {
       const m = new LockManager({ nodes: [${JSON.stringify(server.url)}], ttl: 25000 });
       // Kept referenced: a hold the garbage collector takes is released before the check.
       globalThis.held = [await m.acquireRead('rw:worker:r'), await m.acquireWrite('rw:worker:w')];
       parentPort.postMessage('held');
       setInterval(() => {}, 1000);
     })();`,
  );
  assert.equal(server.cli('HGET', 'rw:worker:r', 'mode'), 'read');
  assert.equal(server.cli('HGET', 'rw:worker:w', 'mode'), 'write');
  await worker.terminate();
  // A 25 s lease: only the teardown can release them in time for this writer.
  const [m] = managers(1);
  const [r, w] = await Promise.all([m.acquireWrite('rw:worker:r', { wait: 20_000 }), m.acquireWrite('rw:worker:w', { wait: 20_000 })]);
  assert.equal(await r.release(), true);
  assert.equal(await w.release(), true);
  await m.close();
  assert.equal(keysNamed('rw:worker:'), 0);
});

test('a call from a loss listener (lock.signal) takes the write lock', T, async () => {
  const key = 'rw:lost';
  const [m] = managers(1);
  let inListener;
  const done = new Promise((resolve) => {
    inListener = resolve;
  });
  const outcome = withReadLock(
    key,
    async (lock) => {
      lock.signal.addEventListener('abort', () => {
        m.acquireWrite(key).then(
          async (again) => inListener({ mode: server.cli('HGET', key, 'mode'), released: await again.release() }),
          (e) => inListener({ error: e }),
        );
      });
      // The hold taken away: the next renewal finds it lost.
      for (const k of server.cli('--scan', '--pattern', `*${key}*`).split('\n').filter(Boolean)) server.cli('DEL', k);
      await done;
    },
    { nodes: [server.url], ttl: 3000 },
  );
  await assert.rejects(outcome, LockLostError);
  assert.deepEqual(await done, { mode: 'write', released: true });
  assert.equal(keysNamed(key), 0);
  await m.close();
});

test('bad keys and ttls are refused naming the value', T, async () => {
  const [m] = managers(1);
  for (const bad of [42, '', null]) {
    for (const call of [() => m.acquireRead(bad), () => m.tryAcquireWrite(bad), () => withReadLock(bad, () => {}), () => withWriteLock(bad, () => {})]) {
      await assert.rejects(call(), (e) => {
        assert.ok(e instanceof InvalidArgumentError, String(e));
        assert.match(e.message, /lock key must be a non-empty string/);
        return true;
      });
    }
  }
  await assert.rejects(m.acquireRead('rw:bad', { ttl: 'ten' }), (e) => {
    assert.ok(e instanceof InvalidArgumentError, String(e));
    assert.match(e.message, /ttl/);
    assert.match(e.message, /ten/);
    return true;
  });
  await assert.rejects(withWriteLock('rw:bad', 'not a function', { nodes: [server.url] }), (e) => {
    assert.match(e.message, /withWriteLock needs a callback function, got string/);
    return true;
  });
  await m.close();
});

test("docs/read-write-lock.md's Node example runs", T, async () => {
  const doc = fs.readFileSync(path.resolve(__dirname, '..', '..', 'docs', 'read-write-lock.md'), 'utf8');
  const example = doc.match(/```js\n([\s\S]*?)```/)[1];
  const out = execFileSync(process.execPath, ['-e', example], {
    cwd: path.resolve(__dirname, '..'),
    env: { ...process.env, FERROLOCK_NODES: server.url },
    encoding: 'utf8',
    timeout: 30_000,
  });
  assert.match(out, /read as \S+, wrote with fence \d+/);
});
