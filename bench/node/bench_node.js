#!/usr/bin/env node
'use strict';
// `make bench`, Node part (issues 15 and 32): what Node services do, C concurrent loops each
// locking a key of its own (C = 1, 16, 64, 256), for
//   - hand-written ioredis: SET NX PX, then a compare-and-delete script (EVALSHA), on every
//     node at once with a majority counted: what a client sending nothing but the two round
//     trips costs, measured in the same process on the same servers;
//   - node-redlock 5.0.0-beta.2 (on the same ioredis clients, retryCount 0);
//   - ferrolock's Node package: `manager.acquire` + `lock.release` (defaults: watchdog on),
//     and `withLock`, with a new options literal per call, as callers write it; both run the
//     same empty async callback while holding (the peers run none);
//   - at C = 1 only, the binding's own floor: an empty async call into the addon.
// Per (library, C): ops/s (median of the rounds), p50/p99 of every acquire+release, and CPU per
// lock: the JavaScript main thread's (/proc/self/task/<pid>/schedstat, what a Node service is
// short of) beside the whole process's (process.cpuUsage(): the core's runtime threads too)
// and the redis-servers'. Then contended (bench/node/contended.js): 4 processes on one key,
// ferrolock vs node-redlock, on 1 and 3 nodes: sections/s, waits, hand-off share, exclusion.
// Each (node count, placement) runs in a process of its own that starts its own
// redis-servers; "pinned" runs that process and its servers on one CPU (`taskset -c 0`),
// "unpinned" lets the scheduler decide. Rounds interleave every (C, library) so that a slow
// moment of the shared machine hits them all.
//
// Usage: node bench/node/bench_node.js [--quick] [--duration S] [--rounds N] [--nodes 1,5]
//          [--concurrency 1,16,64,256] [--placements pinned,unpinned]
//          [--parts uncontended,contended] [--contended-nodes 1,3] [--contended-duration S]
//          [--procs 4] [--out FILE] [--md FILE] [--contended-md FILE] [--svg FILE]
//          [--python-results FILE] (the Python bench's report: its contended worst wait is
//          drawn next to Node's) [--go-results FILE] (bench/go's full report: its C and Go
//          sequential ops/s are drawn at C = 1, its Go contended worst waits too)
//          [--command S]
//   --quick: 2 rounds of 0.4 s, contended 1.5 s: to see the direction of a change on a busy
//   machine; the figures of record come from a full run on a quiet one.
// FERROLOCK_BENCH_PACKAGE=DIR measures another build of node/ (an A/B run of the binding).
const { spawnSync, execFileSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { switches, serverCpu, jsThreadNs } = require('./proc');

const ROOT = path.resolve(__dirname, '..', '..');
// FERROLOCK_BENCH_PACKAGE=DIR: another build of the package (e.g. a copy of main's node/ with
// its addon), to compare two versions of the binding with the same bench.
const PKG = path.resolve(process.env.FERROLOCK_BENCH_PACKAGE || path.join(ROOT, 'node'));
const TTL = 10_000;

function parseArgs(argv) {
  const a = {
    duration: 1,
    rounds: 5,
    nodes: [1, 5],
    concurrency: [1, 16, 64, 256],
    placements: ['pinned', 'unpinned'],
    out: null,
    md: null,
    svg: null,
    parts: ['uncontended', 'contended'],
    contendedNodes: [1, 3],
    contendedDuration: 3,
    procs: 4,
    contendedMd: null,
    pythonResults: null,
    goResults: null,
    quick: false,
    command: 'node bench/node/bench_node.js',
    child: false,
  };
  for (let i = 0; i < argv.length; i++) {
    const v = () => {
      if (i + 1 >= argv.length) throw new Error(`${argv[i]} needs a value`);
      return argv[++i];
    };
    switch (argv[i]) {
      case '--quick':
        Object.assign(a, { quick: true, duration: 0.4, rounds: 2, contendedDuration: 1.5 });
        break;
      case '--duration': a.duration = Number(v()); break;
      case '--rounds': a.rounds = Number(v()); break;
      case '--nodes': a.nodes = v().split(',').map(Number); break;
      case '--concurrency': a.concurrency = v().split(',').map(Number); break;
      case '--placements': a.placements = v().split(','); break;
      case '--out': a.out = v(); break;
      case '--md': a.md = v(); break;
      case '--svg': a.svg = v(); break;
      case '--command': a.command = v(); break;
      case '--parts': a.parts = v().split(','); break;
      case '--contended-nodes': a.contendedNodes = v().split(',').map(Number); break;
      case '--contended-duration': a.contendedDuration = Number(v()); break;
      case '--procs': a.procs = Number(v()); break;
      case '--contended-md': a.contendedMd = v(); break;
      case '--python-results': a.pythonResults = v(); break;
      case '--go-results': a.goResults = v(); break;
      case '--child': a.child = true; break;
      case '-h':
      case '--help':
        {
          const lines = fs.readFileSync(__filename, 'utf8').split('\n').slice(2);
          console.log(lines.slice(0, lines.findIndex((l) => !l.startsWith('//'))).map((l) => l.replace(/^\/\/ ?/, '')).join('\n'));
        }
        process.exit(0);
        break;
      default:
        throw new Error(`unknown argument ${JSON.stringify(argv[i])}`);
    }
  }
  if (!(a.duration > 0) || !(a.rounds >= 1) || a.nodes.some((n) => !(n >= 1))) throw new Error('bad --duration, --rounds or --nodes');
  if (a.concurrency.some((c) => !(Number.isInteger(c) && c >= 1))) throw new Error('bad --concurrency');
  for (const p of a.parts) if (p !== 'uncontended' && p !== 'contended') throw new Error(`unknown part ${JSON.stringify(p)}`);
  if (!(a.contendedDuration > 0) || !(a.procs >= 2) || a.contendedNodes.some((n) => !(n >= 1))) throw new Error('bad --contended-duration, --procs or --contended-nodes');
  for (const p of a.placements) if (p !== 'pinned' && p !== 'unpinned') throw new Error(`unknown placement ${JSON.stringify(p)}`);
  return a;
}

// ---------------------------------------------------------------- one process: measure

const COMPARE_DEL = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";
const IOREDIS = 'hand-written ioredis';
const REDLOCK = 'node-redlock';
const FERRO = 'ferrolock';
const WITHLOCK = 'ferrolock withLock';
const FLOOR = 'binding floor (empty async call)';

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
  // restartGuard 0: the servers are seconds old (as in the Rust, Python and Go benches).
  const manager = new ferrolock.LockManager({ nodes: servers.map((s) => s.url), ttl: TTL, restartGuard: 0 });
  const nodes = servers.map((s) => s.url);
  const body = async () => {};
  let n = 0;
  const libs = [
    {
      name: IOREDIS,
      op: async (i) => {
        const key = `bench:ioredis:${i}`;
        const token = `${process.pid}:${++n}`;
        const set = await Promise.all(clients.map((c) => c.set(key, token, 'PX', TTL, 'NX')));
        if (set.filter((r) => r === 'OK').length < quorum) throw new Error('ioredis: not acquired');
        await Promise.all(clients.map((c) => c.compareDel(key, token)));
      },
    },
    {
      name: REDLOCK,
      op: async (i) => {
        const lock = await redlock.acquire([`bench:redlock:${i}`], TTL);
        await lock.release();
      },
    },
    {
      name: FERRO,
      op: async (i) => {
        const lock = await manager.acquire(`bench:ferrolock:${i}`);
        await body(lock);
        await lock.release();
      },
    },
    {
      name: WITHLOCK,
      op: (i) => ferrolock.withLock(`bench:withlock:${i}`, body, { nodes, ttl: TTL, restartGuard: 0 }),
    },
    { name: FLOOR, op: () => native.__benchNoop(), only: [1] },
  ];
  const close = async () => {
    await manager.close();
    for (const c of clients) c.disconnect();
  };
  return { libs, close };
}

/** `c` loops of `op(i)` for `seconds`; the operations under way when time is up finish and
 * count (their time too). */
async function measure(op, c, seconds, pids = []) {
  const lat = [];
  let errors = 0;
  let stop = false;
  const before = switches();
  const jsBefore = jsThreadNs();
  const cpuBefore = process.cpuUsage();
  const redisBefore = serverCpu(pids);
  const timer = setTimeout(() => (stop = true), seconds * 1000);
  const started = performance.now();
  const loop = async (i) => {
    while (!stop) {
      const t = performance.now();
      try {
        await op(i);
      } catch {
        errors++;
        continue;
      }
      lat.push((performance.now() - t) * 1000);
    }
  };
  await Promise.all(Array.from({ length: c }, (_, i) => loop(i)));
  const elapsed = (performance.now() - started) / 1000;
  clearTimeout(timer);
  const js = (jsThreadNs() - jsBefore) / 1000;
  const cpu = process.cpuUsage(cpuBefore);
  const redisCpu = serverCpu(pids) - redisBefore;
  const after = switches();
  const ops = Math.max(1, lat.length);
  return {
    ops: lat.length / elapsed,
    lat,
    errors,
    jsCpu: js / ops,
    procCpu: (cpu.user + cpu.system) / ops,
    redisCpu: redisCpu / ops,
    sleeps: (after.voluntary - before.voluntary) / ops,
  };
}

const pct = (sorted, p) => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

async function child(args) {
  const { servers } = require(path.join(PKG, 'test', 'redis'));
  const started = await servers(args.nodes[0]);
  const pids = started.map((s) => s.proc.pid);
  try {
    const { libs, close } = await libraries(started);
    const cs = args.concurrency;
    const cells = [];
    for (const c of cs) for (const l of libs) if (!l.only || l.only.includes(c)) cells.push({ c, lib: l, rounds: [] });
    // Warm-up: connections open, code paths compiled, at the largest C.
    for (const l of libs) await measure(l.op, l.only ? 1 : Math.max(...cs), Math.min(0.5, args.duration / 2));
    for (let r = 0; r < args.rounds; r++) {
      for (const cell of cells) cell.rounds.push(await measure(cell.lib.op, cell.c, args.duration, pids));
    }
    await close();
    const rows = cells.map(({ c, lib, rounds }) => {
      const lat = rounds.flatMap((m) => m.lat).sort((a, b) => a - b);
      const med = (f) => median(rounds.map(f));
      return {
        name: lib.name,
        c,
        ops: med((m) => m.ops),
        rounds: rounds.map((m) => m.ops),
        p50: pct(lat, 50),
        p99: pct(lat, 99),
        jsCpu: med((m) => m.jsCpu),
        procCpu: med((m) => m.procCpu),
        redisCpu: med((m) => m.redisCpu),
        sleeps: med((m) => m.sleeps),
        errors: rounds.reduce((a, m) => a + m.errors, 0),
      };
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
  const argv = [__filename, '--child', '--nodes', String(nodes), '--duration', String(args.duration), '--rounds', String(args.rounds), '--concurrency', args.concurrency.join(',')];
  const [cmd, full] = placement === 'pinned' ? ['taskset', ['-c', '0', process.execPath, ...argv]] : [process.execPath, argv];
  const r = spawnSync(cmd, full, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'], timeout: 60 * 60_000 });
  if (r.status !== 0) throw new Error(`bench child (${nodes} nodes, ${placement}) failed: status ${r.status} ${r.signal ?? ''}`);
  return JSON.parse(r.stdout.trim().split('\n').at(-1));
}

const fmt = (x, d = 0) => (x === undefined || Number.isNaN(x) ? '–' : x.toLocaleString('en-US', { maximumFractionDigits: d, minimumFractionDigits: d }));
const plural = (n) => `${n} node${n > 1 ? 's' : ''}`;

function loadLine() {
  const [one, five, fifteen] = os.loadavg();
  return `load average ${fmt(one, 2)} / ${fmt(five, 2)} / ${fmt(fifteen, 2)} (1 / 5 / 15 min) when the report was written`;
}

// Issue 32's targets, from the medians of the rounds of one run; unpinned is the target,
// pinned is reported (there the JavaScript thread, the runtime thread and Redis share one CPU).
function targets(groups) {
  const row = (g, name, c) => g.rows.find((r) => r.name === name && r.c === c);
  const out = [];
  for (const g of groups) {
    const where = `${plural(g.nodes)}, ${g.placement}`;
    const cs = [...new Set(g.rows.map((r) => r.c))];
    const ratio = (c) => row(g, FERRO, c)?.ops / row(g, REDLOCK, c)?.ops;
    const line = (what, value, met, extra = '') => out.push(`- ${where}: ${what}: **${value}** (${met ? 'met' : 'missed'}${extra})`);
    const [lowAt1, high] = g.nodes >= 5 ? [1.0, 2.0] : [0.9, 1.3];
    if (cs.includes(1)) line(`ferrolock ≥ ${fmt(lowAt1, 1)}× node-redlock at C = 1`, `${fmt(ratio(1), 2)}×`, ratio(1) >= lowAt1);
    const big = cs.filter((c) => c >= 16);
    if (big.length) {
      const rs = big.map(ratio);
      line(`ferrolock ≥ ${fmt(high, 1)}× node-redlock at C ≥ 16`, big.map((c, i) => `${fmt(rs[i], 2)}× (C = ${c})`).join(', '), rs.every((r) => r >= high));
      const js = big.map((c) => row(g, FERRO, c)?.jsCpu);
      if (g.nodes === 1) {
        const base = big.map((c) => row(g, IOREDIS, c)?.jsCpu);
        line('JS-thread CPU per lock at C ≥ 16 ≤ hand-written ioredis\'s', big.map((c, i) => `${fmt(js[i], 1)} vs ${fmt(base[i], 1)} µs (C = ${c})`).join(', '), js.every((x, i) => x <= base[i]));
      } else {
        const base = big.map((c) => row(g, REDLOCK, c)?.jsCpu);
        line('JS-thread CPU per lock at C ≥ 16 ≤ ¼ of node-redlock\'s', big.map((c, i) => `${fmt(js[i], 1)} vs ${fmt(base[i], 1)} µs (C = ${c})`).join(', '), js.every((x, i) => x <= base[i] / 4));
      }
    }
    const extra = cs.map((c) => row(g, WITHLOCK, c)?.jsCpu - row(g, FERRO, c)?.jsCpu);
    if (extra.every((x) => !Number.isNaN(x))) {
      line('withLock ≤ 3 µs more JS-thread CPU per lock than acquire + callback + release', cs.map((c, i) => `${fmt(extra[i], 1)} µs (C = ${c})`).join(', '), extra.every((x) => x <= 3));
    }
  }
  return out;
}

function markdown(args, groups, meta) {
  const out = [];
  out.push('## Node comparison (uncontended: C concurrent loops, a key each)', '');
  out.push(
    `C loops in one process, each awaiting acquire → release of a key of its own, ttl ${TTL} ms; ${args.rounds} rounds of ${args.duration} s per ` +
      '(C, library), interleaved; ops/s and CPU per lock are the medians of the rounds, p50/p99 over every acquire+release. ' +
      `${IOREDIS}: SET NX PX + compare-and-delete script on every node at once, majority counted (the two round trips and nothing ` +
      'else). ferrolock runs with its defaults (watchdog on) and an empty async callback while holding, in both rows; `withLock` ' +
      'gets a new options literal per call. node-redlock never renews. "JS thread": the main thread\'s CPU ' +
      '(`/proc/self/task/<pid>/schedstat`); "process": every thread of the process (`process.cpuUsage()`); "Redis": the ' +
      'servers\' threads; "sleeps": voluntary context switches of the process\'s threads.',
    '',
  );
  out.push(
    `Node ${process.version}, ioredis ${meta.ioredis}, node-redlock ${meta.redlock}, ${meta.cpus} CPUs; ${loadLine()}; command: \`${args.command}\`` +
      `${args.quick ? ' (**quick mode**: few short rounds, for the direction of a change only)' : ''}.`,
    '',
  );
  for (const g of groups) {
    out.push(`### ${plural(g.nodes)}, ${g.placement}`, '');
    out.push('| C | library | ops/s | p50 µs | p99 µs | × node-redlock | × hand-written ioredis | JS thread CPU µs/lock | process CPU µs/lock | Redis CPU µs/lock | sleeps/lock | errors |');
    out.push('|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|');
    for (const r of g.rows) {
      const peer = (name) => g.rows.find((x) => x.c === r.c && x.name === name)?.ops;
      out.push(
        `| ${r.c} | ${r.name} | ${fmt(r.ops)} | ${fmt(r.p50)} | ${fmt(r.p99)} | ${fmt(r.ops / peer(REDLOCK), 2)} | ${fmt(r.ops / peer(IOREDIS), 2)} | ` +
          `${fmt(r.jsCpu, 1)} | ${fmt(r.procCpu, 1)} | ${fmt(r.redisCpu, 1)} | ${fmt(r.sleeps, 2)} | ${r.errors} |`,
      );
    }
    out.push('');
  }
  const t = targets(groups);
  if (t.length) out.push('Targets of issue 32 (unpinned is the target; pinned is reported: one CPU for the JavaScript thread, the runtime thread and Redis):', '', ...t, '');
  return out.join('\n');
}

// bench/go's report (bench/results/go.md), for the chart: uncontended ops/s of the C library
// and the Go libraries per (nodes, placement), and Go's contended worst waits per node count.
// Empty when the file or its tables are not there.
const GO_NAMES = {
  'C ferrolock_manager_acquire + release': 'ferrolock (C)',
  'ferrolock Acquire/Release': 'ferrolock (Go)',
  'hand-written go-redis': 'hand-written go-redis',
  redsync: 'redsync',
};
function goResults(file) {
  const out = { uncontended: [], contended: [] };
  if (!file || !fs.existsSync(file)) return out;
  const cells = (l) => l.split('|').slice(1, -1).map((c) => c.trim());
  const num = (c) => Number(c.replace(/[\s,]/g, ''));
  let section = null;
  let heading = null;
  let head = null;
  for (const line of fs.readFileSync(file, 'utf8').split('\n')) {
    if (line.startsWith('### ')) [section, head] = [line, null];
    if (line.startsWith('#### ')) [heading, head] = [/(\d+) nodes?, (pinned|unpinned)/.exec(line), null];
    if (!line.startsWith('|')) {
      head = null;
      continue;
    }
    if (head === null) {
      head = cells(line);
      continue;
    }
    const c = cells(line);
    if (c.every((x) => /^:?-+:?$/.test(x))) continue;
    const at = (name) => c[head.indexOf(name)];
    if (section?.startsWith('### C:') && GO_NAMES[at('implementation')]) {
      out.uncontended.push({ nodes: num(at('nodes')), placement: at('placement'), name: GO_NAMES[at('implementation')], ops: num(at('ops/s')) });
    } else if (section?.startsWith('### Go: uncontended') && heading && GO_NAMES[at('library')]) {
      out.uncontended.push({ nodes: Number(heading[1]), placement: heading[2], name: GO_NAMES[at('library')], ops: num(at('ops/s')) });
    } else if (section?.startsWith('### Go: contended') && ['ferrolock', 'redsync'].includes(at('library'))) {
      const name = at('library') === 'ferrolock' ? 'ferrolock (Go)' : 'redsync';
      out.contended.push({ nodes: num(at('nodes')), name, max: num(at('wait max ms')) });
    }
  }
  return out;
}

// The Python bench's contended worst waits for ferrolock (`wait max ms` of its **Contended**
// table), by node count; [] when the file or the table is not there.
function pythonWorstWaits(file) {
  if (!file || !fs.existsSync(file)) return [];
  const lines = fs.readFileSync(file, 'utf8').split('\n');
  const at = lines.findIndex((l) => l.startsWith('**Contended**'));
  if (at < 0) return [];
  const cells = (l) => l.split('|').slice(1, -1).map((c) => c.trim());
  const h = lines.findIndex((l, i) => i > at && l.startsWith('|'));
  if (h < 0) return [];
  const head = cells(lines[h]);
  const [iNodes, iLib, iMax] = ['nodes', 'library', 'wait max ms'].map((n) => head.indexOf(n));
  if (iNodes < 0 || iLib < 0 || iMax < 0) return [];
  const out = [];
  for (let i = h + 2; i < lines.length && lines[i].startsWith('|'); i++) {
    const c = cells(lines[i]);
    if (c[iLib] === 'ferrolock') out.push({ nodes: Number(c[iNodes]), max: Number(c[iMax].replace(/[\s,]/g, '')) });
  }
  return out;
}

const COLORS = {
  'hand-written ioredis': '#8c8c8c',
  'node-redlock': '#d9822b',
  ferrolock: '#2b6cb0',
  'ferrolock withLock': '#63a4e0',
  'ferrolock (Python)': '#38a169',
  'ferrolock (C)': '#6b46c1',
  'ferrolock (Go)': '#00add8',
  'hand-written go-redis': '#b0b0b0',
  redsync: '#c53030',
};
const esc = (s) => String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;');

// One panel of bars at x offset `left`: groups of { label, bars: [{ name, value, text }] }.
function panel(parts, { left, top, h, title, groups, y, ticks, barW = 26, gap = 28 }) {
  const groupW = (g) => g.bars.length * barW + gap;
  const width = groups.reduce((a, g) => a + groupW(g), 0);
  parts.push(`<text x="${left}" y="${top - 28}" font-size="13" font-weight="bold">${esc(title)}</text>`);
  for (const [t, label] of ticks) {
    parts.push(`<line x1="${left}" x2="${left + width}" y1="${y(t)}" y2="${y(t)}" stroke="#e2e2e2"/>`);
    parts.push(`<text x="${left - 6}" y="${y(t) + 4}" text-anchor="end">${label}</text>`);
  }
  let x0 = left + gap / 2;
  for (const g of groups) {
    g.bars.forEach((b, i) => {
      const x = x0 + i * barW;
      parts.push(`<rect x="${x}" y="${y(b.value)}" width="${barW - 4}" height="${Math.max(0, top + h - y(b.value))}" fill="${COLORS[b.name] ?? '#555'}"><title>${esc(b.name)}: ${esc(b.text)}</title></rect>`);
      parts.push(`<text x="${x + (barW - 4) / 2}" y="${y(b.value) - 3}" text-anchor="middle" font-size="9">${esc(b.label)}</text>`);
    });
    g.label.split('\n').forEach((line, i) => {
      parts.push(`<text x="${x0 + (g.bars.length * barW - 4) / 2}" y="${top + h + 16 + i * 12}" text-anchor="middle">${esc(line)}</text>`);
    });
    x0 += groupW(g);
  }
  return width;
}

function contendedMarkdown(args, cgroups, python) {
  const out = [];
  out.push('## Node comparison (contended: 4 processes, one key)', '');
  out.push(
    `${args.procs} processes, one key, ${args.contendedDuration} s each library, one library after the other on the same redis-servers ` +
      '(unpinned); each process loops: acquire (blocking until granted) → GET + SET of a counter on a separate redis-server → release. ' +
      `ferrolock: \`manager.acquire(key)\` with its defaults (wait until granted as a queued waiter woken by pub/sub, ttl ${TTL} ms, watchdog on); ` +
      'node-redlock: its README\'s retry settings (retryDelay 200 ms, retryJitter 200 ms, driftFactor 0.01) with retryCount -1 ' +
      '("unlimited retries until the lock is acquired", as it documents), ioredis clients. sections/s: grants in the window ÷ its length; ' +
      'wait: acquire called → granted (capped by the window); hand-offs: the share of sections granted to another process than the ' +
      'section before; exclusion: no overlapping [granted, release called] intervals ' +
      '(CLOCK_MONOTONIC across processes) and the non-atomic counter equal to the number of sections.',
    '',
  );
  out.push(`Node ${process.version}; ${loadLine()}; command: \`${args.command}\`${args.quick ? ' (**quick mode**)' : ''}.`, '');
  out.push('| nodes | library | sections/s | per proc min–max | hand-offs | wait p50 ms | wait p99 ms | wait max ms | failed acquires | exclusion |');
  out.push('|---:|---|---:|---:|---:|---:|---:|---:|---:|---|');
  for (const g of cgroups) {
    for (const r of g.rows) {
      const excl = r.held ? `held (${fmt(r.counter)} = counter)` : `**BROKEN** (${r.overlaps} overlaps, counter ${r.counter} for ${r.sections} sections)`;
      out.push(
        `| ${g.nodes} | ${r.name} | ${fmt(r.perSecond)} | ${fmt(r.perProc[0])}–${fmt(r.perProc[1])} | ${fmt(100 * r.handoffs, 1)} % | ${fmt(r.p50, 2)} | ${fmt(r.p99, 2)} | ${fmt(r.max, 2)} | ${r.errors} | ${excl} |`,
      );
    }
  }
  out.push('');
  const targets = [];
  for (const g of cgroups) {
    const f = g.rows.find((r) => r.name === 'ferrolock');
    const r = g.rows.find((x) => x.name === 'node-redlock');
    if (!f) continue;
    const beside = r ? `; sections/s ${fmt(f.perSecond)} vs node-redlock's ${fmt(r.perSecond)} (${fmt(f.perSecond / r.perSecond, 2)}×), hand-offs ${fmt(100 * f.handoffs)} % vs ${fmt(100 * r.handoffs)} %, node-redlock's worst wait ${fmt(r.max, 0)} ms` : '';
    targets.push(`- ${plural(g.nodes)}: ferrolock worst wait ≤ 20 ms: **${fmt(f.max, 2)} ms** (${f.max <= 20 ? 'met' : 'missed'}${beside})`);
  }
  if (python.length) {
    targets.push(
      `- Python ferrolock's worst wait in ${args.pythonResults ? `\`${path.relative(ROOT, path.resolve(args.pythonResults))}\`` : 'the Python report'} (not this run): ` +
        python.map((p) => `${plural(p.nodes)} ${fmt(p.max, 2)} ms`).join(', '),
    );
  }
  if (targets.length) out.push('Targets of issue 32 (the worst wait is issue 15\'s, kept):', '', ...targets, '');
  return out.join('\n');
}

/** One summary line for bench/results/latest.md. */
function summaryLine(groups, cgroups) {
  const parts = [];
  for (const g of groups.filter((x) => x.placement === 'unpinned')) {
    const at = (name, c) => g.rows.find((r) => r.name === name && r.c === c)?.ops;
    const cs = [...new Set(g.rows.map((r) => r.c))];
    parts.push(`${plural(g.nodes)} unpinned ${cs.map((c) => `C=${c} ${fmt(at(FERRO, c) / at(REDLOCK, c), 2)}×`).join(', ')} node-redlock`);
  }
  for (const g of cgroups) {
    const f = g.rows.find((r) => r.name === 'ferrolock');
    if (f) parts.push(`contended ${plural(g.nodes)} worst wait ${fmt(f.max, 1)} ms`);
  }
  return parts.length ? `Node (issue 32): ${parts.join('; ')}.` : '';
}

// Left: ops/s against C per library, a panel per (nodes, placement), C on a log scale (the
// C and Go figures of bench/go, sequential, as points at C = 1); below: contended worst wait
// per library (log scale: node-redlock's retry sleeps are hundreds of ms, ferrolock's waits a few).
function svg(groups, cgroups, python, go) {
  const parts = [];
  const names = new Set();
  const top = 60;
  const h = 220;
  const w = 230;
  let x = 80;
  for (const g of groups) {
    const cs = [...new Set(g.rows.map((r) => r.c))].sort((a, b) => a - b);
    const libs = [...new Set(g.rows.filter((r) => r.name !== FLOOR).map((r) => r.name))];
    const extra = go.uncontended.filter((r) => r.nodes === g.nodes && r.placement === g.placement);
    const max = Math.max(...g.rows.filter((r) => r.name !== FLOOR).map((r) => r.ops), ...extra.map((r) => r.ops));
    const step = 10 ** Math.floor(Math.log10(max));
    const scaleMax = Math.ceil(max / step) * step;
    const y = (v) => top + h - (v / scaleMax) * h;
    const lx = (c) => x + (cs.length > 1 ? (Math.log(c / cs[0]) / Math.log(cs.at(-1) / cs[0])) * w : w / 2);
    parts.push(`<text x="${x}" y="${top - 14}" font-size="12" font-weight="bold">${esc(`${plural(g.nodes)}, ${g.placement}`)}</text>`);
    for (let t = 0; t <= scaleMax; t += step) {
      parts.push(`<line x1="${x}" x2="${x + w}" y1="${y(t)}" y2="${y(t)}" stroke="#e2e2e2"/>`);
      parts.push(`<text x="${x - 6}" y="${y(t) + 4}" text-anchor="end">${fmt(t / 1000)}k</text>`);
    }
    for (const c of cs) parts.push(`<text x="${lx(c)}" y="${top + h + 16}" text-anchor="middle">${c}</text>`);
    parts.push(`<text x="${x + w / 2}" y="${top + h + 32}" text-anchor="middle">C (concurrent loops)</text>`);
    for (const name of libs) {
      names.add(name);
      const pts = cs.map((c) => g.rows.find((r) => r.name === name && r.c === c)).filter(Boolean);
      const color = COLORS[name] ?? '#555';
      parts.push(`<polyline fill="none" stroke="${color}" stroke-width="2" points="${pts.map((r) => `${lx(r.c)},${y(r.ops)}`).join(' ')}"/>`);
      for (const r of pts) parts.push(`<circle cx="${lx(r.c)}" cy="${y(r.ops)}" r="3" fill="${color}"><title>${esc(`${name}, C = ${r.c}: ${fmt(r.ops)} ops/s`)}</title></circle>`);
    }
    for (const r of extra) {
      names.add(r.name);
      parts.push(`<rect x="${lx(cs[0]) - 4}" y="${y(r.ops) - 4}" width="8" height="8" fill="none" stroke="${COLORS[r.name] ?? '#555'}" stroke-width="2"><title>${esc(`${r.name} (bench/go, sequential): ${fmt(r.ops)} ops/s`)}</title></rect>`);
    }
    x += w + 90;
  }
  if (groups.length) parts.unshift(`<text x="80" y="20" font-size="13" font-weight="bold">Uncontended acquire+release, ops/s against C concurrent loops (higher is better)</text>`);
  const cbars = cgroups.map((g) => ({
    label: `Node\n${plural(g.nodes)}`,
    bars: g.rows.map((r) => {
      names.add(r.name);
      return { name: r.name, value: r.max, label: fmt(r.max, r.max < 100 ? 1 : 0), text: `worst wait ${fmt(r.max, 2)} ms` };
    }),
  }));
  for (const p of python) {
    names.add('ferrolock (Python)');
    cbars.push({ label: `Python\n${plural(p.nodes)}`, bars: [{ name: 'ferrolock (Python)', value: p.max, label: fmt(p.max, p.max < 100 ? 1 : 0), text: `worst wait ${fmt(p.max, 2)} ms` }] });
  }
  for (const nodes of [...new Set(go.contended.map((r) => r.nodes))]) {
    cbars.push({
      label: `Go\n${plural(nodes)}`,
      bars: go.contended.filter((r) => r.nodes === nodes).map((r) => {
        names.add(r.name);
        return { name: r.name, value: r.max, label: fmt(r.max, r.max < 100 ? 1 : 0), text: `worst wait ${fmt(r.max, 2)} ms` };
      }),
    });
  }
  let width = Math.max(x, 640);
  let bottom = groups.length ? top + h + 50 : 0;
  if (cbars.length) {
    const ctop = bottom + 60;
    const hi = 10 ** Math.ceil(Math.log10(Math.max(10, ...cbars.flatMap((g) => g.bars.map((b) => b.value)))));
    const lo = 0.1;
    const y = (v) => ctop + h - (Math.log10(Math.max(lo, v) / lo) / Math.log10(hi / lo)) * h;
    const ticks = [];
    for (let t = lo; t <= hi * 1.001; t *= 10) ticks.push([t, t < 1 ? String(t) : fmt(t)]);
    const cw = panel(parts, { left: 80, top: ctop, h, title: 'Contended (4 processes, one key): worst wait, ms (log; lower is better)', groups: cbars, y, ticks });
    width = Math.max(width, cw + 120);
    bottom = ctop + h + 30;
  }
  let ly = bottom + 20;
  let lx = 80;
  for (const name of names) {
    parts.push(`<rect x="${lx}" y="${ly - 10}" width="12" height="12" fill="${COLORS[name] ?? '#555'}"/>`);
    parts.push(`<text x="${lx + 18}" y="${ly}">${esc(name === FERRO ? 'ferrolock (Node)' : name)}</text>`);
    lx += 170;
    if (lx > width - 170) {
      lx = 80;
      ly += 18;
    }
  }
  const height = ly + 20;
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" font-family="sans-serif" font-size="11">`,
    '<rect width="100%" height="100%" fill="white"/>',
    ...parts,
    '</svg>',
    '',
  ].join('\n');
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  if (args.child) return child(args);
  const pinnedOk = hasTaskset();
  const groups = [];
  if (args.parts.includes('uncontended')) {
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
  }
  const cgroups = [];
  if (args.parts.includes('contended')) {
    const { contended } = require('./contended');
    for (const nodes of args.contendedNodes) {
      console.error(`bench_node: contended, ${nodes} node(s) ...`);
      cgroups.push({ nodes, rows: await contended({ nodeCount: nodes, duration: args.contendedDuration, procs: args.procs }) });
    }
  }
  const python = pythonWorstWaits(args.pythonResults);
  const version = (name) => JSON.parse(fs.readFileSync(path.join(__dirname, 'node_modules', name, 'package.json'), 'utf8')).version;
  const mds = [];
  if (groups.length) mds.push(markdown(args, groups, { ioredis: version('ioredis'), redlock: version('redlock'), cpus: os.cpus().length }));
  if (cgroups.length) mds.push(contendedMarkdown(args, cgroups, python));
  // The report (latest.md) gets the summary line and links; the full tables go to their files.
  const files = [args.md && groups.length && args.md, args.contendedMd && cgroups.length && args.contendedMd].filter(Boolean);
  const summary = summaryLine(groups, cgroups);
  const md = files.length
    ? ['## Node comparison', '', summary, '', `Full tables: ${files.map((f) => `\`${path.relative(ROOT, path.resolve(f))}\``).join(', ')}.`, ''].join('\n')
    : mds.join('\n');
  process.stdout.write(mds.join('\n') + '\n');
  if (args.out) fs.writeFileSync(args.out, md + '\n');
  if (args.md && groups.length) fs.writeFileSync(args.md, mds[0] + '\n');
  if (args.contendedMd && cgroups.length) fs.writeFileSync(args.contendedMd, mds.at(-1) + '\n');
  if (args.svg) fs.writeFileSync(args.svg, svg(groups, cgroups, python, goResults(args.goResults)));
}

main().catch((e) => {
  console.error(`bench_node: ${e.stack || e}`);
  process.exit(1);
});
