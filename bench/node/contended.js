'use strict';
// `make bench`, Node part, contended (issues 15 and 32): 4 processes on one key, each a loop of
// acquire (blocking until granted) -> GET + SET of a counter on a separate redis-server ->
// release, for
//   - ferrolock's Node package: `manager.acquire(key)` (default wait: until granted, with its
//     default retry: queued waiter, woken by pub/sub) and `lock.release()`;
//   - node-redlock 5.0.0-beta.2 with the retry settings its README documents (retryDelay 200,
//     retryJitter 200) and retryCount -1, which it documents as "unlimited retries until the
//     lock is acquired" (the README's retryCount 10 would give up after ~2 s: that is not a
//     blocking acquire).
// Both on the same redis-servers, in the same run, one after the other (different keys).
// Exclusion: the counter ends equal to the number of sections, and no two [granted,
// release called] intervals overlap (CLOCK_MONOTONIC, shared by every process here).
//
// As a module: `contended({ nodes, duration, procs })` runs it and returns the rows.
// As a worker process: node contended.js --worker LIB --nodes URL,... --counter PORT
//   --key K --duration S (reads "go" on stdin, prints one JSON line).
const { spawn } = require('node:child_process');
const path = require('node:path');

const ROOT = path.resolve(__dirname, '..', '..');
const PKG = path.resolve(process.env.FERROLOCK_BENCH_PACKAGE || path.join(ROOT, 'node'));
const TTL = 10_000;
const LIBS = ['ferrolock', 'node-redlock'];

const nowUs = () => Number(process.hrtime.bigint() / 1000n);

async function makeLib(lib, urls) {
  if (lib === 'ferrolock') {
    const { LockManager } = require(PKG);
    const manager = new LockManager({ nodes: urls, ttl: TTL, restartGuard: 0 });
    return {
      acquire: (key) => manager.acquire(key),
      release: (lock) => lock.release(),
      close: () => manager.close(),
    };
  }
  if (lib === 'node-redlock') {
    const Redis = require('ioredis');
    const Redlock = require('redlock').default;
    const clients = urls.map((u) => new Redis(u, { maxRetriesPerRequest: 1 }));
    await Promise.all(clients.map((c) => c.ping()));
    const redlock = new Redlock(clients, { driftFactor: 0.01, retryCount: -1, retryDelay: 200, retryJitter: 200 });
    return {
      acquire: (key) => redlock.acquire([key], TTL),
      release: (lock) => lock.release(),
      close: async () => {
        for (const c of clients) c.disconnect();
      },
    };
  }
  throw new Error(`unknown library ${JSON.stringify(lib)}`);
}

async function worker(opts) {
  const Redis = require('ioredis');
  const counter = new Redis(opts.counter, '127.0.0.1');
  await counter.ping();
  const lib = await makeLib(opts.worker, opts.nodes);
  // Warm the connections on a key of this process's own before the start line.
  await lib.release(await lib.acquire(`${opts.key}:warm:${process.pid}`));
  process.stdout.write('ready\n');
  await new Promise((resolve) => process.stdin.once('data', resolve));
  const start = nowUs();
  const end = start + opts.duration * 1e6;
  const counterKey = `${opts.key}:counter`;
  const waits = [];
  const intervals = [];
  let errors = 0;
  while (nowUs() < end) {
    const called = nowUs();
    let lock;
    try {
      lock = await lib.acquire(opts.key);
    } catch (e) {
      errors++;
      if (errors > 1000) throw e;
      continue;
    }
    const granted = nowUs();
    // Capped by the window: a process that gets in only after the others stopped.
    waits.push((Math.min(granted, end) - called) / 1000);
    const v = Number(await counter.get(counterKey)) || 0;
    await counter.set(counterKey, String(v + 1));
    const releasing = nowUs();
    intervals.push([granted, releasing]);
    await lib.release(lock);
  }
  await lib.close();
  counter.disconnect();
  // Written before process.exit() only once flushed: a pipe write of this size is partly
  // asynchronous, and exiting at once cut the record (the full run failed parsing it).
  await new Promise((resolve) => process.stdout.write(JSON.stringify({ start, end, waits, intervals, errors }) + '\n', resolve));
}

function spawnWorker(lib, urls, counterPort, key, duration) {
  const p = spawn(
    process.execPath,
    [__filename, '--worker', lib, '--nodes', urls.join(','), '--counter', String(counterPort), '--key', key, '--duration', String(duration)],
    { stdio: ['pipe', 'pipe', 'inherit'] },
  );
  let out = '';
  let readyResolve;
  const ready = new Promise((r) => (readyResolve = r));
  p.stdout.on('data', (d) => {
    out += d;
    if (out.includes('ready\n')) readyResolve();
  });
  const done = new Promise((resolve, reject) => {
    // 'close', not 'exit': the worker's last lines may still be in the pipe when it exits.
    p.on('close', (code, signal) => {
      if (code !== 0) return reject(new Error(`contended worker (${lib}) exited ${code} ${signal ?? ''}`));
      resolve(JSON.parse(out.trim().split('\n').at(-1)));
    });
  });
  done.catch(() => readyResolve());
  return { p, ready, done };
}

const pct = (sorted, p) => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];

async function runOne(lib, urls, counter, key, duration, procs) {
  const ws = Array.from({ length: procs }, () => spawnWorker(lib, urls, counter.port, key, duration));
  await Promise.all(ws.map((w) => w.ready));
  for (const w of ws) w.p.stdin.end('go\n');
  const results = await Promise.all(ws.map((w) => w.done));
  const start = Math.min(...results.map((r) => r.start));
  const end = Math.max(...results.map((r) => r.end));
  const all = results.flatMap((r, i) => r.intervals.map(([a, b]) => [a, b, i]));
  all.sort((x, y) => x[0] - y[0]);
  let overlaps = 0;
  let handoffs = 0;
  for (let i = 1; i < all.length; i++) {
    if (all[i][0] < all[i - 1][1]) overlaps++;
    if (all[i][2] !== all[i - 1][2]) handoffs++;
  }
  const counted = Number(counter.cli('GET', `${key}:counter`)) || 0;
  const inWindow = results.map((r) => r.intervals.filter(([a]) => a < r.end).length);
  const waits = results.flatMap((r) => r.waits).sort((a, b) => a - b);
  const seconds = (end - start) / 1e6;
  return {
    name: lib,
    sections: all.length,
    perSecond: inWindow.reduce((a, b) => a + b, 0) / seconds,
    perProc: [Math.min(...inWindow), Math.max(...inWindow)].map((n) => n / seconds),
    p50: pct(waits, 50),
    p99: pct(waits, 99),
    max: waits.at(-1),
    // Sections granted to another process than the one before (the rest: a process retaking).
    handoffs: all.length > 1 ? handoffs / (all.length - 1) : 0,
    counter: counted,
    overlaps,
    errors: results.reduce((a, r) => a + r.errors, 0),
    held: overlaps === 0 && counted === all.length,
  };
}

/** Runs every library on `nodeCount` lock servers plus a counter server; returns the rows. */
async function contended({ nodeCount, duration, procs }) {
  const { servers } = require(path.join(PKG, 'test', 'redis'));
  const started = await servers(nodeCount + 1);
  const counter = started[nodeCount];
  const urls = started.slice(0, nodeCount).map((s) => s.url);
  try {
    const rows = [];
    for (const lib of LIBS) rows.push(await runOne(lib, urls, counter, `bench:contended:${lib}`, duration, procs));
    return rows;
  } finally {
    for (const s of started) s.stop();
  }
}

module.exports = { contended, LIBS };

if (require.main === module) {
  const argv = process.argv.slice(2);
  const opts = {};
  for (let i = 0; i < argv.length; i += 2) opts[argv[i].replace(/^--/, '')] = argv[i + 1];
  opts.nodes = opts.nodes.split(',');
  opts.counter = Number(opts.counter);
  opts.duration = Number(opts.duration);
  worker(opts).then(
    () => process.exit(0),
    (e) => {
      console.error(`contended worker: ${e.stack || e}`);
      process.exit(1);
    },
  );
}
