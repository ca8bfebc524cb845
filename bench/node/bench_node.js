#!/usr/bin/env node
'use strict';
// `make bench`, Node part (issue 15): uncontended acquire+release per second, one caller
// awaiting each operation in turn, for
//   - hand-written ioredis: SET NX PX, then a compare-and-delete script (EVALSHA), on every
//     node at once with a majority counted: the baseline, measured in the same run on the
//     same servers, that every ratio is against;
//   - node-redlock 5.0.0-beta.2 (on the same ioredis clients, retryCount 0);
//   - ferrolock's Node package: `manager.acquire` + `lock.release` (defaults: watchdog on),
//     and `withLock` with an empty callback;
//   - the binding's own floor: an empty async call into the addon (a promise resolved from
//     the core's runtime), the cost every ferrolock call pays before any Redis work.
// Each (node count, placement) runs in a process of its own that starts its own
// redis-servers; "pinned" runs that process and its servers on one CPU (`taskset -c 0`),
// "unpinned" lets the scheduler decide. Rounds interleave the libraries so that a slow
// moment of the shared machine hits them all; ops/s is the median over the rounds.
//
// Usage: node bench/node/bench_node.js [--duration S] [--rounds N] [--nodes 1,5]
//          [--placements pinned,unpinned] [--out FILE] [--md FILE] [--svg FILE] [--command S]
const { spawnSync, execFileSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const ROOT = path.resolve(__dirname, '..', '..');
const PKG = path.join(ROOT, 'node');
const TTL = 10_000;

function parseArgs(argv) {
  const a = {
    duration: 2,
    rounds: 3,
    nodes: [1, 5],
    placements: ['pinned', 'unpinned'],
    out: null,
    md: null,
    svg: null,
    command: 'node bench/node/bench_node.js',
    child: false,
  };
  for (let i = 0; i < argv.length; i++) {
    const v = () => {
      if (i + 1 >= argv.length) throw new Error(`${argv[i]} needs a value`);
      return argv[++i];
    };
    switch (argv[i]) {
      case '--duration': a.duration = Number(v()); break;
      case '--rounds': a.rounds = Number(v()); break;
      case '--nodes': a.nodes = v().split(',').map(Number); break;
      case '--placements': a.placements = v().split(','); break;
      case '--out': a.out = v(); break;
      case '--md': a.md = v(); break;
      case '--svg': a.svg = v(); break;
      case '--command': a.command = v(); break;
      case '--child': a.child = true; break;
      case '-h':
      case '--help':
        console.log(fs.readFileSync(__filename, 'utf8').split('\n').slice(2, 20).map((l) => l.replace(/^\/\/ ?/, '')).join('\n'));
        process.exit(0);
        break;
      default:
        throw new Error(`unknown argument ${JSON.stringify(argv[i])}`);
    }
  }
  if (!(a.duration > 0) || !(a.rounds >= 1) || a.nodes.some((n) => !(n >= 1))) throw new Error('bad --duration, --rounds or --nodes');
  for (const p of a.placements) if (p !== 'pinned' && p !== 'unpinned') throw new Error(`unknown placement ${JSON.stringify(p)}`);
  return a;
}

// ---------------------------------------------------------------- one process: measure

const COMPARE_DEL = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

async function libraries(servers) {
  const Redis = require('ioredis');
  const Redlock = require('redlock').default;
  const ferrolock = require(PKG);
  const native = require(path.join(PKG, 'lib', 'native'));
  const clients = servers.map((s) => {
    const c = new Redis(s.port, '127.0.0.1', { maxRetriesPerRequest: 1, enableOfflineQueue: true });
    c.defineCommand('compareDel', { numberOfKeys: 1, lua: COMPARE_DEL });
    return c;
  });
  await Promise.all(clients.map((c) => c.ping()));
  const quorum = Math.floor(servers.length / 2) + 1;
  const redlock = new Redlock(clients, { retryCount: 0, driftFactor: 0.01 });
  const manager = new ferrolock.LockManager({ nodes: servers.map((s) => s.url), ttl: TTL });
  const nodes = servers.map((s) => s.url);
  let n = 0;
  const libs = [
    {
      name: 'hand-written ioredis',
      op: async () => {
        const token = `${process.pid}:${++n}`;
        const set = await Promise.all(clients.map((c) => c.set('bench:ioredis', token, 'PX', TTL, 'NX')));
        if (set.filter((r) => r === 'OK').length < quorum) throw new Error('ioredis: not acquired');
        await Promise.all(clients.map((c) => c.compareDel('bench:ioredis', token)));
      },
    },
    {
      name: 'node-redlock',
      op: async () => {
        const lock = await redlock.acquire(['bench:redlock'], TTL);
        await lock.release();
      },
    },
    {
      name: 'ferrolock',
      op: async () => {
        const lock = await manager.acquire('bench:ferrolock');
        await lock.release();
      },
    },
    {
      name: 'ferrolock withLock',
      op: () => ferrolock.withLock('bench:withlock', async () => {}, { nodes, ttl: TTL }),
    },
    { name: 'binding floor (empty async call)', op: () => native.__benchNoop() },
  ];
  const close = async () => {
    await manager.close();
    for (const c of clients) c.disconnect();
  };
  return { libs, close };
}

async function measure(op, seconds) {
  const lat = [];
  const end = performance.now() + seconds * 1000;
  const started = performance.now();
  let now = started;
  while (now < end) {
    const t = process.hrtime.bigint();
    await op();
    lat.push(Number(process.hrtime.bigint() - t) / 1000);
    now = performance.now();
  }
  return { ops: lat.length / ((now - started) / 1000), lat };
}

function pct(sorted, p) {
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

async function child(args) {
  const { servers } = require(path.join(PKG, 'test', 'redis'));
  const nodeCount = args.nodes[0];
  const started = await servers(nodeCount);
  try {
    const { libs, close } = await libraries(started);
    for (const l of libs) await measure(l.op, Math.min(0.5, args.duration / 2)); // warm-up
    const rounds = libs.map(() => []);
    for (let r = 0; r < args.rounds; r++) {
      for (let i = 0; i < libs.length; i++) rounds[i].push(await measure(libs[i].op, args.duration));
    }
    await close();
    const rows = libs.map((l, i) => {
      const ops = rounds[i].map((m) => m.ops).sort((a, b) => a - b);
      const lat = rounds[i].flatMap((m) => m.lat).sort((a, b) => a - b);
      return { name: l.name, ops: ops[Math.floor(ops.length / 2)], p50: pct(lat, 50), p99: pct(lat, 99), rounds: ops };
    });
    process.stdout.write(JSON.stringify(rows) + '\n');
  } finally {
    for (const s of started) s.stop();
  }
}

// ---------------------------------------------------------------- the parent: run, report

function hasTaskset() {
  try {
    execFileSync('taskset', ['-c', '0', 'true']);
    return true;
  } catch {
    return false;
  }
}

function runChild(args, nodes, placement) {
  const argv = [__filename, '--child', '--nodes', String(nodes), '--duration', String(args.duration), '--rounds', String(args.rounds)];
  const [cmd, full] = placement === 'pinned' ? ['taskset', ['-c', '0', process.execPath, ...argv]] : [process.execPath, argv];
  const r = spawnSync(cmd, full, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'], timeout: 30 * 60_000 });
  if (r.status !== 0) throw new Error(`bench child (${nodes} nodes, ${placement}) failed: status ${r.status} ${r.signal ?? ''}`);
  return JSON.parse(r.stdout.trim().split('\n').at(-1));
}

const BASELINE = 'hand-written ioredis';
const fmt = (x, d = 0) => x.toLocaleString('en-US', { maximumFractionDigits: d, minimumFractionDigits: d });

function markdown(args, groups, meta) {
  const out = [];
  out.push('## Node comparison (uncontended acquire+release)', '');
  out.push(
    `One caller awaiting each acquire+release in turn, ttl ${TTL} ms, ${args.rounds} rounds of ${args.duration} s per library, interleaved; ` +
      `ops/s is the median round, p50/p99 over every operation. Baseline: ${BASELINE} (SET NX PX + compare-and-delete script, ` +
      'on every node at once, majority counted), measured in the same process on the same redis-servers. ferrolock runs with its ' +
      'defaults (watchdog on); node-redlock never renews. "binding floor" is an empty async call into the addon.',
    '',
  );
  out.push(`Node ${process.version}, ioredis ${meta.ioredis}, node-redlock ${meta.redlock}, ${meta.cpus} CPUs; command: \`${args.command}\`.`, '');
  for (const g of groups) {
    const base = g.rows.find((r) => r.name === BASELINE).ops;
    const redlock = g.rows.find((r) => r.name === 'node-redlock').ops;
    out.push(`### ${g.nodes} node${g.nodes > 1 ? 's' : ''}, ${g.placement}`, '');
    out.push('| library | ops/s | p50 µs | p99 µs | × hand-written ioredis | × node-redlock |');
    out.push('|---|---:|---:|---:|---:|---:|');
    for (const r of g.rows) {
      out.push(`| ${r.name} | ${fmt(r.ops)} | ${fmt(r.p50)} | ${fmt(r.p99)} | ${fmt(r.ops / base, 2)} | ${fmt(r.ops / redlock, 2)} |`);
    }
    out.push('');
  }
  const find = (nodes, placement, name) => groups.find((g) => g.nodes === nodes && g.placement === placement)?.rows.find((r) => r.name === name)?.ops;
  const targets = [];
  const f1 = find(1, 'pinned', 'ferrolock');
  const b1 = find(1, 'pinned', BASELINE);
  if (f1 && b1) targets.push(`- ferrolock ≥ 1.0× hand-written ioredis, pinned, 1 node: **${fmt(f1 / b1, 2)}×** (${f1 >= b1 ? 'met' : 'missed'})`);
  for (const p of ['pinned', 'unpinned']) {
    const f5 = find(5, p, 'ferrolock');
    const r5 = find(5, p, 'node-redlock');
    if (f5 && r5) targets.push(`- ferrolock ≥ 1.5× node-redlock, 5 nodes, ${p}: **${fmt(f5 / r5, 2)}×** (${f5 >= 1.5 * r5 ? 'met' : 'missed'})`);
  }
  if (targets.length) out.push('Targets of issue 15:', '', ...targets, '');
  return out.join('\n');
}

function svg(groups) {
  const libs = groups[0].rows.map((r) => r.name).filter((n) => !n.startsWith('binding floor'));
  const colors = ['#8c8c8c', '#d9822b', '#2b6cb0', '#63a4e0'];
  const barW = 26;
  const gap = 28;
  const groupW = libs.length * barW + gap;
  const left = 70;
  const top = 50;
  const h = 260;
  const width = left + groups.length * groupW + 20;
  const height = top + h + 70 + libs.length * 18;
  const max = Math.max(...groups.flatMap((g) => g.rows.filter((r) => libs.includes(r.name)).map((r) => r.ops)));
  const step = 10 ** Math.floor(Math.log10(max));
  const scaleMax = Math.ceil(max / step) * step;
  const y = (v) => top + h - (v / scaleMax) * h;
  const esc = (s) => String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;');
  const parts = [];
  parts.push(`<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" font-family="sans-serif" font-size="11">`);
  parts.push(`<rect width="100%" height="100%" fill="white"/>`);
  parts.push(`<text x="${left}" y="22" font-size="14" font-weight="bold">Node: uncontended acquire+release, ops/s (higher is better)</text>`);
  for (let t = 0; t <= scaleMax; t += step) {
    parts.push(`<line x1="${left}" x2="${width - 10}" y1="${y(t)}" y2="${y(t)}" stroke="#e2e2e2"/>`);
    parts.push(`<text x="${left - 6}" y="${y(t) + 4}" text-anchor="end">${fmt(t)}</text>`);
  }
  groups.forEach((g, gi) => {
    const x0 = left + gi * groupW + gap / 2;
    libs.forEach((name, li) => {
      const r = g.rows.find((row) => row.name === name);
      const x = x0 + li * barW;
      parts.push(`<rect x="${x}" y="${y(r.ops)}" width="${barW - 4}" height="${top + h - y(r.ops)}" fill="${colors[li % colors.length]}"><title>${esc(name)}: ${fmt(r.ops)} ops/s</title></rect>`);
      parts.push(`<text x="${x + (barW - 4) / 2}" y="${y(r.ops) - 3}" text-anchor="middle" font-size="9">${fmt(r.ops / 1000, 1)}k</text>`);
    });
    parts.push(`<text x="${x0 + (libs.length * barW) / 2}" y="${top + h + 16}" text-anchor="middle">${g.nodes} node${g.nodes > 1 ? 's' : ''}, ${g.placement}</text>`);
  });
  libs.forEach((name, li) => {
    const ly = top + h + 40 + li * 18;
    parts.push(`<rect x="${left}" y="${ly - 10}" width="12" height="12" fill="${colors[li % colors.length]}"/>`);
    parts.push(`<text x="${left + 18}" y="${ly}">${esc(name)}</text>`);
  });
  parts.push('</svg>');
  return parts.join('\n') + '\n';
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  if (args.child) return child(args);
  const pinnedOk = hasTaskset();
  const groups = [];
  for (const nodes of args.nodes) {
    for (const placement of args.placements) {
      if (placement === 'pinned' && !pinnedOk) {
        console.error('bench_node: taskset not available, skipping the pinned runs');
        continue;
      }
      console.error(`bench_node: ${nodes} node(s), ${placement} ...`);
      groups.push({ nodes, placement, rows: runChild(args, nodes, placement) });
    }
  }
  const version = (name) => JSON.parse(fs.readFileSync(path.join(__dirname, 'node_modules', name, 'package.json'), 'utf8')).version;
  const md = markdown(args, groups, { ioredis: version('ioredis'), redlock: version('redlock'), cpus: require('node:os').cpus().length });
  process.stdout.write(md + '\n');
  if (args.out) fs.writeFileSync(args.out, md + '\n');
  if (args.md) fs.writeFileSync(args.md, md + '\n');
  if (args.svg) fs.writeFileSync(args.svg, svg(groups));
}

main().catch((e) => {
  console.error(`bench_node: ${e.stack || e}`);
  process.exit(1);
});
