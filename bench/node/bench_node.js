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
// Then contended (bench/node/contended.js): 4 processes on one key, ferrolock vs node-redlock,
// on 1 and 3 nodes, sections/s, wait p50/p99/max and exclusion.
// Each (node count, placement) runs in a process of its own that starts its own
// redis-servers; "pinned" runs that process and its servers on one CPU (`taskset -c 0`),
// "unpinned" lets the scheduler decide. Rounds interleave the libraries so that a slow
// moment of the shared machine hits them all; ops/s is the median over the rounds.
//
// Usage: node bench/node/bench_node.js [--duration S] [--rounds N] [--nodes 1,5]
//          [--placements pinned,unpinned] [--parts uncontended,contended]
//          [--contended-nodes 1,3] [--contended-duration S] [--procs 4]
//          [--out FILE] [--md FILE] [--contended-md FILE] [--svg FILE]
//          [--python-results FILE] (the Python bench's report: its contended worst wait is
//          drawn next to Node's) [--go-results FILE] (bench/go's full report: its C and Go
//          uncontended ops/s and Go contended worst waits are drawn too) [--rust-results FILE]
//          (the Rust part's report: its hand-written redis-rs floor is quoted next to the
//          5-node target, as what a client doing nothing but the two round trips reaches)
//          [--command S]
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
    parts: ['uncontended', 'contended'],
    contendedNodes: [1, 3],
    contendedDuration: 3,
    procs: 4,
    contendedMd: null,
    pythonResults: null,
    goResults: null,
    rustResults: null,
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
      case '--parts': a.parts = v().split(','); break;
      case '--contended-nodes': a.contendedNodes = v().split(',').map(Number); break;
      case '--contended-duration': a.contendedDuration = Number(v()); break;
      case '--procs': a.procs = Number(v()); break;
      case '--contended-md': a.contendedMd = v(); break;
      case '--python-results': a.pythonResults = v(); break;
      case '--go-results': a.goResults = v(); break;
      case '--rust-results': a.rustResults = v(); break;
      case '--child': a.child = true; break;
      case '-h':
      case '--help':
        console.log(fs.readFileSync(__filename, 'utf8').split('\n').slice(2, 25).map((l) => l.replace(/^\/\/ ?/, '')).join('\n'));
        process.exit(0);
        break;
      default:
        throw new Error(`unknown argument ${JSON.stringify(argv[i])}`);
    }
  }
  if (!(a.duration > 0) || !(a.rounds >= 1) || a.nodes.some((n) => !(n >= 1))) throw new Error('bad --duration, --rounds or --nodes');
  for (const p of a.parts) if (p !== 'uncontended' && p !== 'contended') throw new Error(`unknown part ${JSON.stringify(p)}`);
  if (!(a.contendedDuration > 0) || !(a.procs >= 2) || a.contendedNodes.some((n) => !(n >= 1))) throw new Error('bad --contended-duration, --procs or --contended-nodes');
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
  // restartGuard 0: the servers are seconds old (as in the Rust, Python and Go benches).
  const manager = new ferrolock.LockManager({ nodes: servers.map((s) => s.url), ttl: TTL, restartGuard: 0 });
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
      op: () => ferrolock.withLock('bench:withlock', async () => {}, { nodes, ttl: TTL, restartGuard: 0 }),
    },
    { name: 'binding floor (empty async call)', op: () => native.__benchNoop() },
  ];
  const close = async () => {
    await manager.close();
    for (const c of clients) c.disconnect();
  };
  return { libs, close };
}

// Context switches of every thread of this process so far (voluntary: a thread slept,
// waiting; involuntary: preempted), from /proc: the profile of where a binding's time goes,
// since every hop between the JavaScript thread and another thread is a sleep and a wake-up.
function switches() {
  let voluntary = 0;
  let involuntary = 0;
  for (const t of fs.readdirSync('/proc/self/task')) {
    let s;
    try {
      s = fs.readFileSync(`/proc/self/task/${t}/status`, 'utf8');
    } catch {
      continue; // a thread that ended since the listing
    }
    voluntary += Number(/^voluntary_ctxt_switches:\s+(\d+)/m.exec(s)?.[1] ?? 0);
    involuntary += Number(/^nonvoluntary_ctxt_switches:\s+(\d+)/m.exec(s)?.[1] ?? 0);
  }
  return { voluntary, involuntary };
}

// CPU time of every thread of the redis-servers `pids` so far, in µs (/proc/<pid>/task/*/schedstat:
// nanoseconds on the CPU, exact where /proc/<pid>/stat counts 10 ms ticks).
function serverCpu(pids) {
  let ns = 0;
  for (const pid of pids) {
    let tasks = [];
    try {
      tasks = fs.readdirSync(`/proc/${pid}/task`);
    } catch {
      continue;
    }
    for (const t of tasks) {
      try {
        ns += Number(fs.readFileSync(`/proc/${pid}/task/${t}/schedstat`, 'utf8').split(' ')[0]);
      } catch {
        // a thread that ended since the listing
      }
    }
  }
  return ns / 1000;
}

async function measure(op, seconds, pids = []) {
  const lat = [];
  const before = switches();
  const cpuBefore = process.cpuUsage();
  const redisBefore = serverCpu(pids);
  const end = performance.now() + seconds * 1000;
  const started = performance.now();
  let now = started;
  while (now < end) {
    const t = process.hrtime.bigint();
    await op();
    lat.push(Number(process.hrtime.bigint() - t) / 1000);
    now = performance.now();
  }
  const after = switches();
  const cpu = process.cpuUsage(cpuBefore);
  const redisCpu = serverCpu(pids) - redisBefore;
  return {
    clientCpu: (cpu.user + cpu.system) / lat.length,
    redisCpu: redisCpu / lat.length,
    ops: lat.length / ((now - started) / 1000),
    lat,
    sleeps: (after.voluntary - before.voluntary) / lat.length,
    preempted: (after.involuntary - before.involuntary) / lat.length,
  };
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
      for (let i = 0; i < libs.length; i++) rounds[i].push(await measure(libs[i].op, args.duration, started.map((s) => s.proc.pid)));
    }
    await close();
    const rows = libs.map((l, i) => {
      const ops = rounds[i].map((m) => m.ops).sort((a, b) => a - b);
      const lat = rounds[i].flatMap((m) => m.lat).sort((a, b) => a - b);
      const median = (xs) => xs.sort((a, b) => a - b)[Math.floor(xs.length / 2)];
      return {
        name: l.name,
        ops: ops[Math.floor(ops.length / 2)],
        p50: pct(lat, 50),
        p99: pct(lat, 99),
        rounds: ops,
        sleeps: median(rounds[i].map((m) => m.sleeps)),
        preempted: median(rounds[i].map((m) => m.preempted)),
        clientCpu: median(rounds[i].map((m) => m.clientCpu)),
        redisCpu: median(rounds[i].map((m) => m.redisCpu)),
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
    out.push(
      '| library | ops/s | p50 µs | p99 µs | × hand-written ioredis | × node-redlock | thread sleeps/op | preemptions/op | client CPU µs/op | Redis CPU µs/op |',
    );
    out.push('|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|');
    for (const r of g.rows) {
      out.push(
        `| ${r.name} | ${fmt(r.ops)} | ${fmt(r.p50)} | ${fmt(r.p99)} | ${fmt(r.ops / base, 2)} | ${fmt(r.ops / redlock, 2)} | ${fmt(r.sleeps, 2)} | ${fmt(r.preempted, 2)} | ${fmt(r.clientCpu, 1)} | ${fmt(r.redisCpu, 1)} |`,
      );
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
    if (!f5 || !r5) continue;
    const floor = rustFloor(args.rustResults, 5, p);
    // What the target asks for, next to the clients that do nothing but the two round trips.
    const bound = [`${fmt(1.5 * r5)} ops/s asked for`];
    const b5 = find(5, p, BASELINE);
    if (b5) bound.push(`${BASELINE} ${fmt(b5)} (${fmt((1.5 * r5) / b5, 2)}× it is asked for)`);
    if (floor) bound.push(`the Rust part's hand-written redis-rs floor ${fmt(floor)}, on its own servers (${fmt((1.5 * r5) / floor, 2)}× it is asked for)`);
    targets.push(`- ferrolock ≥ 1.5× node-redlock, 5 nodes, ${p}: **${fmt(f5 / r5, 2)}×** (${f5 >= 1.5 * r5 ? 'met' : 'missed'}; ${bound.join('; ')})`);
  }
  if (targets.length) out.push('Targets of issue 15:', '', ...targets, '');
  const row = (name) => groups.find((g) => g.nodes === 1 && g.placement === 'pinned')?.rows.find((r) => r.name === name);
  const [fr, br, floor] = [row('ferrolock'), row(BASELINE), row('binding floor (empty async call)')];
  if (fr && br && floor) {
    out.push(
      'Where the time goes (1 node, pinned; "thread sleeps/op": voluntary context switches of the process\'s threads per ' +
        `acquire+release, read from /proc): ioredis does its I/O on the JavaScript thread and sleeps ${fmt(br.sleeps, 2)} times per ` +
        `pair; ferrolock does it on the core's runtime threads, never on the JavaScript thread, so each of its two calls is ` +
        `a hop there and back: ${fmt(fr.sleeps, 2)} sleeps per pair (the empty call alone: ${fmt(floor.sleeps, 2)}). On one CPU ` +
        'every such sleep is a switch to another thread of this process or to Redis, which the baseline does not pay.',
      '',
    );
  }
  // Pinned, the client and every redis-server share one CPU: ops/s is about 10^6 / (client + Redis CPU µs per op),
  // so a target in ops/s is a CPU budget per op, and the Redis share of it is spent whatever the client does.
  const pinned = (nodes, name) => groups.find((g) => g.nodes === nodes && g.placement === 'pinned')?.rows.find((r) => r.name === name);
  const budget = (nodes, target, factor, baseName) => {
    const [f, b, fl] = [pinned(nodes, 'ferrolock'), pinned(nodes, baseName), pinned(nodes, 'binding floor (empty async call)')];
    if (!f || !b || !fl || !f.redisCpu) return null;
    const allowed = 1e6 / (factor * b.ops);
    return (
      `${nodes} node${nodes > 1 ? 's' : ''}: ${target} is ${fmt(factor * b.ops)} ops/s, a budget of ${fmt(allowed, 1)} µs per acquire+release; ` +
      `ferrolock spends ${fmt(f.clientCpu, 1)} µs in this process and ${fmt(f.redisCpu, 1)} µs in Redis (${baseName}: ` +
      `${fmt(b.clientCpu, 1)} and ${fmt(b.redisCpu, 1)}; two empty calls into the addon: ${fmt(2 * fl.clientCpu, 1)}), so it would need ` +
      `${fmt(Math.max(0, allowed - f.redisCpu), 1)} µs or less in this process.`
    );
  };
  const budgets = [
    budget(1, '1.0× hand-written ioredis', 1.0, BASELINE),
    budget(5, '1.5× node-redlock', 1.5, 'node-redlock'),
  ].filter(Boolean);
  if (budgets.length) {
    out.push(
      'CPU budget (pinned: this process and every redis-server share one CPU, so ops/s ≈ 10⁶ ÷ (client + Redis CPU µs per ' +
        'acquire+release); client CPU from `process.cpuUsage()`, Redis CPU from the servers\' `/proc/<pid>/task/*/schedstat`):',
      '',
      ...budgets.map((b) => `- ${b}`),
      '',
    );
  }
  return out.join('\n');
}

// The Rust part's hand-written redis-rs floor (SET NX PX + compare-and-delete by hand, every
// node at once), median ops/s for (nodes, placement), from its report's **Detail** table; null
// when the file or the row is not there.
function rustFloor(file, nodes, placement) {
  if (!file || !fs.existsSync(file)) return null;
  for (const line of fs.readFileSync(file, 'utf8').split('\n')) {
    const c = line.split('|').slice(1, -1).map((x) => x.trim());
    // | pass | nodes | impl | runs × ops | ops/s min | ops/s median | ...
    if (c.length > 5 && c[0] === placement && c[1] === String(nodes) && c[2] === 'floor') return Number(c[5].replace(/[\s,]/g, ''));
  }
  return null;
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

function contendedMarkdown(args, cgroups, python) {
  const out = [];
  out.push('## Node comparison (contended: 4 processes, one key)', '');
  out.push(
    `${args.procs} processes, one key, ${args.contendedDuration} s each library, one library after the other on the same redis-servers ` +
      '(unpinned); each process loops: acquire (blocking until granted) → GET + SET of a counter on a separate redis-server → release. ' +
      `ferrolock: \`manager.acquire(key)\` with its defaults (wait until granted as a queued waiter woken by pub/sub, ttl ${TTL} ms, watchdog on); ` +
      'node-redlock: its README\'s retry settings (retryDelay 200 ms, retryJitter 200 ms, driftFactor 0.01) with retryCount -1 ' +
      '("unlimited retries until the lock is acquired", as it documents), ioredis clients. sections/s: grants in the window ÷ its length; ' +
      'wait: acquire called → granted (capped by the window); exclusion: no overlapping [granted, release called] intervals ' +
      '(CLOCK_MONOTONIC across processes) and the non-atomic counter equal to the number of sections.',
    '',
  );
  out.push(`Node ${process.version}; command: \`${args.command}\`.`, '');
  out.push('| nodes | library | sections/s | per proc min–max | wait p50 ms | wait p99 ms | wait max ms | failed acquires | exclusion |');
  out.push('|---:|---|---:|---:|---:|---:|---:|---:|---|');
  for (const g of cgroups) {
    for (const r of g.rows) {
      const excl = r.held ? `held (${fmt(r.counter)} = counter)` : `**BROKEN** (${r.overlaps} overlaps, counter ${r.counter} for ${r.sections} sections)`;
      out.push(
        `| ${g.nodes} | ${r.name} | ${fmt(r.perSecond)} | ${fmt(r.perProc[0])}–${fmt(r.perProc[1])} | ${fmt(r.p50, 2)} | ${fmt(r.p99, 2)} | ${fmt(r.max, 2)} | ${r.errors} | ${excl} |`,
      );
    }
  }
  out.push('');
  const targets = [];
  for (const g of cgroups) {
    const f = g.rows.find((r) => r.name === 'ferrolock');
    if (f) targets.push(`- ${g.nodes} node${g.nodes > 1 ? 's' : ''}: ferrolock worst wait ≤ 20 ms: **${fmt(f.max, 2)} ms** (${f.max <= 20 ? 'met' : 'missed'})`);
  }
  if (python.length) {
    targets.push(
      `- Python ferrolock's worst wait in ${args.pythonResults ? `\`${path.relative(ROOT, path.resolve(args.pythonResults))}\`` : 'the Python report'} (not this run): ` +
        python.map((p) => `${p.nodes} node${p.nodes > 1 ? 's' : ''} ${fmt(p.max, 2)} ms`).join(', '),
    );
  }
  if (targets.length) out.push('Targets of issue 15:', '', ...targets, '');
  return out.join('\n');
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
const plural = (n) => `${n} node${n > 1 ? 's' : ''}`;

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

// Left: uncontended ops/s per library (linear); right: contended worst wait per library (log
// scale: node-redlock's retry sleeps are hundreds of ms, ferrolock's waits a few).
function svg(groups, cgroups, python, go) {
  const top = 60;
  const h = 260;
  const parts = [];
  let x = 70;
  const names = new Set();
  if (groups.length) {
    const libs = groups[0].rows.map((r) => r.name).filter((n) => !n.startsWith('binding floor'));
    const max = Math.max(
      ...groups.flatMap((g) => g.rows.filter((r) => libs.includes(r.name)).map((r) => r.ops)),
      ...go.uncontended.filter((r) => groups.some((g) => g.nodes === r.nodes && g.placement === r.placement)).map((r) => r.ops),
    );
    const step = 10 ** Math.floor(Math.log10(max));
    const scaleMax = Math.ceil(max / step) * step;
    const ticks = [];
    for (let t = 0; t <= scaleMax; t += step) ticks.push([t, fmt(t)]);
    const y = (v) => top + h - (v / scaleMax) * h;
    const bar = (name, ops) => {
      names.add(name);
      return { name, value: ops, label: `${fmt(ops / 1000, 1)}k`, text: `${fmt(ops)} ops/s` };
    };
    const bars = groups.map((g) => ({
      label: `${plural(g.nodes)}\n${g.placement}`,
      bars: [
        ...libs.map((name) => bar(name, g.rows.find((row) => row.name === name).ops)),
        ...go.uncontended.filter((r) => r.nodes === g.nodes && r.placement === g.placement).map((r) => bar(r.name, r.ops)),
      ],
    }));
    x += panel(parts, { left: x, top, h, title: 'Uncontended acquire+release, ops/s (higher is better)', groups: bars, y, ticks }) + 90;
  }
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
  if (cbars.length) {
    const hi = 10 ** Math.ceil(Math.log10(Math.max(10, ...cbars.flatMap((g) => g.bars.map((b) => b.value)))));
    const lo = 0.1;
    const y = (v) => top + h - (Math.log10(Math.max(lo, v) / lo) / Math.log10(hi / lo)) * h;
    const ticks = [];
    for (let t = lo; t <= hi * 1.001; t *= 10) ticks.push([t, t < 1 ? String(t) : fmt(t)]);
    x += panel(parts, { left: x, top, h, title: `Contended (4 processes, one key): worst wait, ms (log; lower is better)`, groups: cbars, y, ticks });
  }
  const width = Math.max(x + 20, 640);
  let ly = top + h + 50;
  let lx = 70;
  for (const name of names) {
    parts.push(`<rect x="${lx}" y="${ly - 10}" width="12" height="12" fill="${COLORS[name] ?? '#555'}"/>`);
    parts.push(`<text x="${lx + 18}" y="${ly}">${esc(name === 'ferrolock' ? 'ferrolock (Node)' : name)}</text>`);
    lx += 170;
    if (lx > width - 170) {
      lx = 70;
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
  if (groups.length) mds.push(markdown(args, groups, { ioredis: version('ioredis'), redlock: version('redlock'), cpus: require('node:os').cpus().length }));
  if (cgroups.length) mds.push(contendedMarkdown(args, cgroups, python));
  const md = mds.join('\n');
  process.stdout.write(md + '\n');
  if (args.out) fs.writeFileSync(args.out, md + '\n');
  if (args.md && groups.length) fs.writeFileSync(args.md, mds[0] + '\n');
  if (args.contendedMd && cgroups.length) fs.writeFileSync(args.contendedMd, mds.at(-1) + '\n');
  if (args.svg) fs.writeFileSync(args.svg, svg(groups, cgroups, python, goResults(args.goResults)));
}

main().catch((e) => {
  console.error(`bench_node: ${e.stack || e}`);
  process.exit(1);
});
