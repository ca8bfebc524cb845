// A Node worker of the mixes: `node worker.js NODE_PACKAGE MODE URL KEY ROUNDS SEED OUT`, as
// worker.py: MODE `rw`, the read or the write side at random (a write in three); MODE `sem:P`,
// 1 or 2 permits (2 in four) of a pool of P; each hold's interval (process.hrtime:
// CLOCK_MONOTONIC) appended to OUT.
'use strict';
const fs = require('node:fs');
const [pkg, mode, url, key, rounds, seed, out] = process.argv.slice(2);
const { LockManager } = require(pkg);

// A small seeded generator (mulberry32), so that a failing mix can be replayed.
let s = Number(seed) >>> 0;
function rand() {
  s = (s + 0x6d2b79f5) >>> 0;
  let t = s;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

(async () => {
  const manager = new LockManager({ nodes: [url], ttl: 10000 });
  const lines = [];
  for (let i = 0; i < Number(rounds); i++) {
    let kind;
    let lock;
    if (mode === 'rw') {
      kind = rand() < 1 / 3 ? 'write' : 'read';
      lock = kind === 'write' ? await manager.acquireWrite(key) : await manager.acquireRead(key);
    } else {
      const count = rand() < 1 / 4 ? 2 : 1;
      kind = `permits:${count}`;
      lock = await manager.acquirePermit(key, { permits: Number(mode.split(':')[1]), count });
    }
    const start = process.hrtime.bigint();
    await sleep(2 + rand() * 4);
    const end = process.hrtime.bigint();
    await lock.release();
    lines.push(`node ${kind} ${start} ${end}\n`);
  }
  await manager.close();
  fs.appendFileSync(out, lines.join(''));
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
