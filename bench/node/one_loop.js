#!/usr/bin/env node
'use strict';
// A reduced bench_node.js for A/B runs of the binding (docs/decisions, "Node: one task per
// call"): C concurrent loops, each `acquire` + an empty async body + `release` (or `withLock`)
// on a key of its own, ferrolock alone, against redis-servers you started.
//
// Usage: node bench/node/one_loop.js URL[,URL...] C SECONDS [acquire|withlock]
// Prints one JSON line: locks/s, process CPU per lock (µs), the JavaScript thread's CPU per
// lock (µs) and the process's voluntary context switches per lock.
// FERROLOCK_BENCH_PACKAGE=DIR measures another build of node/, as in bench_node.js.
const path = require('node:path');
const { switches, jsThreadNs } = require('./proc');

const [urls, c, seconds, mode = 'acquire'] = process.argv.slice(2);
if (!urls || !(Number(c) > 0) || !(Number(seconds) > 0) || !['acquire', 'withlock'].includes(mode)) {
  console.error('usage: node bench/node/one_loop.js URL[,URL...] C SECONDS [acquire|withlock]');
  process.exit(2);
}
const ferrolock = require(path.resolve(process.env.FERROLOCK_BENCH_PACKAGE || path.join(__dirname, '..', '..', 'node')));
const nodes = urls.split(',');
const options = { nodes, ttl: 10_000, restartGuard: 0 };
const manager = new ferrolock.LockManager(options);
const body = async () => {};

(async () => {
  let locks = 0;
  let stop = false;
  const loop = async (i) => {
    while (!stop) {
      if (mode === 'acquire') {
        const lock = await manager.acquire(`one_loop:${i}`);
        await body();
        await lock.release();
      } else {
        await ferrolock.withLock(`one_loop:w:${i}`, body, { ...options });
      }
      locks++;
    }
  };
  const [js0, sleeps0, cpu0, t0] = [jsThreadNs(), switches().voluntary, process.cpuUsage(), performance.now()];
  setTimeout(() => (stop = true), Number(seconds) * 1000);
  await Promise.all(Array.from({ length: Number(c) }, (_, i) => loop(i)));
  const elapsed = (performance.now() - t0) / 1000;
  const cpu = process.cpuUsage(cpu0);
  console.log(JSON.stringify({
    c: Number(c),
    mode,
    locksPerSecond: Math.round(locks / elapsed),
    processCpuUs: +((cpu.user + cpu.system) / locks).toFixed(1),
    jsThreadCpuUs: +((jsThreadNs() - js0) / 1000 / locks).toFixed(1),
    sleepsPerLock: +((switches().voluntary - sleeps0) / locks).toFixed(2),
  }));
  await manager.close();
})();
