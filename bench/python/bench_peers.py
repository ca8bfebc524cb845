#!/usr/bin/env python3
"""ferrolock's Python package against the Python lock libraries people use today (issue 6).

One run, on the same redis-servers (started here: ``--save "" --appendonly no``, one temp dir
each, killed by pid at the end):

* uncontended: one client acquires and releases a free key back to back: ops/s and latency
  p50/p99, on 1 node (ferrolock, redis-py ``Lock``, a hand-written redis-py floor,
  python-redis-lock, pottery ``Redlock``) and 5 nodes (ferrolock and pottery, the only ones that
  take several masters), in a pinned pass (this process, all its threads and every server on one
  CPU) and an unpinned pass;
* contended: ``--workers`` (4) processes on one key, each looping acquire -> GET + SET of a
  counter on a separate server -> release for ``--duration`` seconds: critical sections/s, wait
  p50/p99/max, the hand-off from a release to the next grant in another process, and exclusion
  (no overlapping sections; the non-atomic counter is exact).

Writes a markdown section to ``--out`` (bench/run.sh merges it into bench/results/latest.md).
Run with the bench venv: ``bench/run.sh --python-only`` creates it.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import datetime
import importlib.metadata
import multiprocessing
import os
import platform
import resource
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

import redis

# Issue 6's targets.
TARGET_VS_REDIS_PY = 1.5  # uncontended, 1 node
TARGET_VS_POTTERY = 5.0  # uncontended, 5 nodes
TARGET_WORST_WAIT_MS = 14.0  # contended: 1/10 of python-redis-lock's 0.14 s
TTL = 10  # seconds, every library
WARMUP = 200
# Each uncontended run is interleaved with the other libraries' in this many chunks.
CHUNKS = 10

# --------------------------------------------------------------------------- servers


@dataclass
class Server:
    port: int
    proc: subprocess.Popen[bytes]
    dir: str

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server() -> Server:
    exe = shutil.which("redis-server")
    if exe is None:
        sys.exit("bench_peers: redis-server is not on PATH (make redis)")
    for _ in range(20):
        port = free_port()
        d = tempfile.mkdtemp(prefix="ferrolock-bench-redis-")
        args = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", d, "--daemonize", "no", "--protected-mode", "no"]
        log = open(os.path.join(d, "redis.log"), "wb")
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        log.close()
        server = Server(port, proc, d)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if server.client().ping():
                    return server
            except redis.ConnectionError:
                time.sleep(0.02)
        stop_server(server)  # port taken, or too slow: try another port
    sys.exit("bench_peers: could not start redis-server")


def stop_server(s: Server) -> None:
    if s.proc.poll() is None:
        s.proc.kill()
        s.proc.wait()
    shutil.rmtree(s.dir, ignore_errors=True)


# --------------------------------------------------------------------------- placement


def tasks(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


def place(cpus: set[int], pids: list[int]) -> None:
    """sched_setaffinity on every thread of every process (taskset -a -p): this one (the
    ferrolock runtime's threads too) and the servers. Threads made later inherit it."""
    for pid in pids:
        for tid in tasks(pid):
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(tid, cpus)


# --------------------------------------------------------------------------- implementations


class Impl:
    """One library, used the way its documentation shows."""

    name = ""
    multi_node = False

    def __init__(self, servers: list[Server], key: str) -> None:
        self.key = key

    def pair(self) -> None:
        """acquire + release of a free key (uncontended)."""
        raise NotImplementedError

    def acquire(self) -> object:
        """Blocking acquire (contended); returns what release needs."""
        raise NotImplementedError

    def release(self, handle: object) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class Ferrolock(Impl):
    name = "ferrolock"
    multi_node = True

    def __init__(self, servers: list[Server], key: str) -> None:
        super().__init__(servers, key)
        import ferrolock

        # The servers were started seconds ago: without this a 5-node manager would not count
        # their votes for a ttl (the Redlock restart rule).
        self.manager = ferrolock.LockManager(nodes=[s.url for s in servers], ttl=TTL, restart_guard=0)

    def pair(self) -> None:
        with self.manager.lock(self.key):
            pass

    def acquire(self) -> object:
        return self.manager.acquire(self.key)

    def release(self, handle: object) -> None:
        if not handle.release():  # type: ignore[attr-defined]
            raise RuntimeError("ferrolock: release found the lock gone")

    def close(self) -> None:
        self.manager.close()


class FerrolockExplicit(Ferrolock):
    name = "ferrolock acquire/release"

    def pair(self) -> None:
        self.manager.acquire(self.key).release()


class RedisPyLock(Impl):
    name = "redis-py Lock"

    def __init__(self, servers: list[Server], key: str) -> None:
        super().__init__(servers, key)
        (server,) = servers
        self.r = server.client()

    def pair(self) -> None:
        with self.r.lock(self.key, timeout=TTL):
            pass

    def acquire(self) -> object:
        lock = self.r.lock(self.key, timeout=TTL)
        if not lock.acquire():
            raise RuntimeError("redis-py: blocking acquire returned False")
        return lock

    def release(self, handle: object) -> None:
        handle.release()  # type: ignore[attr-defined]

    def close(self) -> None:
        self.r.close()


class RedisPyFloor(Impl):
    """What a careful hand-written client pays: SET NX PX, then EVALSHA compare-and-delete."""

    name = "redis-py by hand"
    RELEASE = "if redis.call('GET',KEYS[1])==ARGV[1] then return redis.call('DEL',KEYS[1]) end return 0"

    def __init__(self, servers: list[Server], key: str) -> None:
        super().__init__(servers, key)
        (server,) = servers
        self.r = server.client()
        self.script = self.r.register_script(self.RELEASE)

    def pair(self) -> None:
        token = secrets.token_hex(16)
        if not self.r.set(self.key, token, nx=True, px=TTL * 1000):
            raise RuntimeError("floor: free key refused")
        if self.script(keys=[self.key], args=[token]) != 1:
            raise RuntimeError("floor: compare-and-delete found no lock")

    def close(self) -> None:
        self.r.close()


class PythonRedisLock(Impl):
    name = "python-redis-lock"

    def __init__(self, servers: list[Server], key: str) -> None:
        super().__init__(servers, key)
        import redis_lock

        (server,) = servers
        self.r = server.client()
        self.mod = redis_lock

    def pair(self) -> None:
        with self.mod.Lock(self.r, self.key, expire=TTL):
            pass

    def acquire(self) -> object:
        lock = self.mod.Lock(self.r, self.key, expire=TTL)
        if not lock.acquire(blocking=True):
            raise RuntimeError("python-redis-lock: blocking acquire returned False")
        return lock

    def release(self, handle: object) -> None:
        handle.release()  # type: ignore[attr-defined]

    def close(self) -> None:
        self.r.close()


class Pottery(Impl):
    name = "pottery Redlock"
    multi_node = True

    def __init__(self, servers: list[Server], key: str) -> None:
        super().__init__(servers, key)
        from pottery import Redlock

        self.clients = [s.client() for s in servers]
        # One instance per key, reused, as pottery's documentation does.
        self.lock = Redlock(key=key, masters=set(self.clients), auto_release_time=TTL)

    def pair(self) -> None:
        with self.lock:
            pass

    def acquire(self) -> object:
        if not self.lock.acquire():
            raise RuntimeError("pottery: blocking acquire returned False")
        return self.lock

    def release(self, handle: object) -> None:
        handle.release()  # type: ignore[attr-defined]

    def close(self) -> None:
        for c in self.clients:
            c.close()


IMPLS: dict[str, type[Impl]] = {
    c.name: c for c in (Ferrolock, FerrolockExplicit, RedisPyLock, RedisPyFloor, PythonRedisLock, Pottery)
}
UNCONTENDED_1 = [Ferrolock, FerrolockExplicit, RedisPyLock, RedisPyFloor, PythonRedisLock, Pottery]
UNCONTENDED_N = [Ferrolock, FerrolockExplicit, Pottery]
CONTENDED = [(Ferrolock, 1), (RedisPyLock, 1), (PythonRedisLock, 1), (Pottery, 1), (Ferrolock, 5), (Pottery, 5)]

# --------------------------------------------------------------------------- stats


def pct(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile, as the Rust bench computes it."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), int(-(-p * len(sorted_values) // 1))))
    return sorted_values[rank - 1]


def num(x: float) -> str:
    """12345.6 -> '12 346'."""
    if x != x:
        return "-"
    return f"{round(x):,}".replace(",", " ")


def table(header: list[tuple[str, str]], rows: list[list[str]], caption: str) -> str:
    widths = [max([len(h), 3] + [len(r[i]) for r in rows]) for i, (h, _) in enumerate(header)]

    def line(cells: list[str]) -> str:
        parts = [c.ljust(w) if a == "l" else c.rjust(w) for c, w, (_, a) in zip(cells, widths, header)]
        return "| " + " | ".join(parts) + " |"

    rule = [(":" + "-" * (w - 1)) if a == "l" else ("-" * (w - 1) + ":") for w, (_, a) in zip(widths, header)]
    out = [caption, "", line([h for h, _ in header]), "| " + " | ".join(rule) + " |"]
    out += [line(r) for r in rows]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- uncontended


@dataclass
class Series:
    runs: list[tuple[int, float]] = field(default_factory=list)  # (ops, seconds)
    lat_ns: list[int] = field(default_factory=list)
    cpu_s: float = 0.0  # this process, every thread (getrusage)
    switches: int = 0  # voluntary + involuntary context switches, every thread

    def ops_per_sec(self) -> list[float]:
        return [n / s for n, s in self.runs]


def timed(impl: Impl, ops: int, series: Series) -> float:
    """Times `ops` pairs; returns the seconds they took."""
    lat = series.lat_ns
    pair = impl.pair
    clock = time.perf_counter_ns
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    start = clock()
    for _ in range(ops):
        t = clock()
        pair()
        lat.append(clock() - t)
    elapsed = (clock() - start) / 1e9
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    series.cpu_s += ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime
    series.switches += ru1.ru_nvcsw + ru1.ru_nivcsw - ru0.ru_nvcsw - ru0.ru_nivcsw
    return elapsed


def uncontended(args: argparse.Namespace, servers: list[Server]) -> tuple[str, list[str]]:
    initial = os.sched_getaffinity(0)
    other = min((initial - {args.cpu}) or {args.cpu})

    def placement(pass_name: str) -> None:
        server_pids = [s.proc.pid for s in servers]
        if pass_name == "pinned":
            place({args.cpu}, [os.getpid()] + server_pids)
        elif pass_name == "split":
            place({args.cpu}, [os.getpid()])
            place({other}, server_pids)
        else:
            place(initial, [os.getpid()] + server_pids)

    rows = []
    verdicts = []
    diagnostics = []
    for pass_name in args.passes:
        placement(pass_name)
        for n in args.nodes:
            classes = [c for c in (UNCONTENDED_1 if n == 1 else UNCONTENDED_N) if n == 1 or c.multi_node]
            classes = [c for c in classes if not args.only or c.name in args.only]
            ops = args.ops or (2000 if n == 1 else 500)
            print(f"bench_peers: uncontended {pass_name} nodes={n}: {args.runs} runs x {ops} ops of "
                  f"{', '.join(c.name for c in classes)}", file=sys.stderr)
            impls = []
            for i, c in enumerate(classes):
                impl = c(servers[:n], f"ferrolock-bench:py:uncontended:{i}")
                for _ in range(WARMUP):
                    impl.pair()
                impls.append((impl, Series()))
            # Placement again: ferrolock's runtime threads start on first use.
            placement(pass_name)
            chunk = -(-ops // CHUNKS)
            turn = 0
            for _ in range(args.runs):
                secs = [0.0] * len(impls)
                done = 0
                while done < ops:
                    k = min(chunk, ops - done)
                    # A B C, then C B A, in chunks: drift and CPU migrations land on every library alike.
                    order = range(len(impls)) if turn % 2 == 0 else reversed(range(len(impls)))
                    turn += 1
                    for i in order:
                        secs[i] += timed(impls[i][0], k, impls[i][1])
                    done += k
                for (_, series), sec in zip(impls, secs):
                    series.runs.append((ops, sec))
            results = {}
            config_rows = []
            for impl, series in impls:
                impl.close()
                tput = sorted(series.ops_per_sec())
                lat = sorted(series.lat_ns)
                results[impl.name] = statistics.median(tput)
                config_rows.append([pass_name, str(n), impl.name, f"{len(series.runs)} × {ops}", num(tput[0]),
                                    num(statistics.median(tput)), num(tput[-1]), f"{pct(lat, 0.5) / 1e3:.1f}",
                                    f"{pct(lat, 0.99) / 1e3:.1f}", f"{series.cpu_s * 1e6 / len(lat):.0f}",
                                    f"{series.switches / len(lat):.1f}"])
            base, target = (RedisPyLock.name, TARGET_VS_REDIS_PY) if n == 1 else (Pottery.name, TARGET_VS_POTTERY)
            for row in config_rows:
                row.append(f"{results[row[2]] / results[base]:.2f}" if base in results else "-")
            rows += config_rows
            fl = results.get(Ferrolock.name)
            if fl and base in results:
                ratio = fl / results[base]
                # split is a diagnostic, not one of issue 6's passes.
                if pass_name != "split":
                    verdicts.append(f"uncontended {pass_name} {n} node(s): ferrolock {ratio:.2f}x {base} "
                                    f"(target ≥ {target:g}x: {'met' if ratio >= target else '**missed**'})")
                series_of = {impl.name: ser for impl, ser in impls}
                f_s, b_s = series_of[Ferrolock.name], series_of[base]
                per_op = [(ser.cpu_s * 1e6 / len(ser.lat_ns), ser.switches / len(ser.lat_ns),
                           pct(sorted(ser.lat_ns), 0.5) / 1e3) for ser in (f_s, b_s)]
                diagnostics.append(
                    f"- {pass_name} {n} node(s): ferrolock p50 {per_op[0][2]:.0f} µs, {per_op[0][0]:.0f} µs "
                    f"client CPU "
                    f"and {per_op[0][1]:.1f} context switches per op; {base}: p50 {per_op[1][2]:.0f} µs, "
                    f"{per_op[1][0]:.0f} µs CPU, {per_op[1][1]:.1f} switches.")
    placement("unpinned")
    header = [("pass", "l"), ("nodes", "r"), ("library", "l"), ("runs × ops", "r"), ("ops/s min", "r"),
              ("ops/s median", "r"), ("ops/s max", "r"), ("p50 µs", "r"), ("p99 µs", "r"),
              ("client CPU µs/op", "r"), ("ctx switches/op", "r"), ("× baseline", "r")]
    text = table(header, rows,
                 "**Uncontended** — one acquire + release of a free key; latency pooled over the runs; "
                 "client CPU and context switches: this process, every thread (getrusage); "
                 "× baseline: median ops/s over redis-py Lock's (1 node) or pottery's (5 nodes).")
    if diagnostics:
        text += ("\nPer operation (on one node ferrolock's blocking calls do their I/O on the calling thread, as "
                 "redis-py does: two context switches per acquire + release; on 5 nodes the attempt runs as a task "
                 "on ferrolock's runtime threads, which costs thread wake-ups, cheap on one CPU and dear across "
                 "CPUs):\n\n"
                 + "\n".join(diagnostics) + "\n")
    return text, verdicts


# --------------------------------------------------------------------------- contended


def worker(cls_name: str, urls: list[str], counter_port: int, key: str, counter_key: str,
           ready: multiprocessing.Queue, go: multiprocessing.synchronize.Event,
           start_end: multiprocessing.Array, looped: multiprocessing.synchronize.Barrier, out: str) -> None:
    servers = [Server(int(u.rsplit(":", 1)[1]), None, "") for u in urls]  # type: ignore[arg-type]
    impl = IMPLS[cls_name](servers, key)
    counter = redis.Redis(host="127.0.0.1", port=counter_port)
    counter.ping()
    h = impl.acquire()  # connect (and load scripts) before the start
    impl.release(h)
    ready.put(os.getpid())
    go.wait()
    start, end = start_end[0], start_end[1]
    while time.monotonic_ns() < start:
        time.sleep(0.0005)
    clock = time.monotonic_ns
    recs = []
    q0, w0 = run_delay_ns(), clock()
    while clock() < end:
        t0 = clock()
        h = impl.acquire()
        t1 = clock()
        v = counter.get(counter_key)
        counter.set(counter_key, int(v or 0) + 1)
        t2 = clock()
        impl.release(h)
        t3 = clock()
        recs.append(f"{t0} {t1} {t2} {t3}\n")
    share = (run_delay_ns() - q0) / max(1, clock() - w0)
    # The records are written once every worker is out of its loop: writing them (and exiting)
    # takes CPU that would otherwise delay the last waits of the workers still looping.
    looped.wait(timeout=60)
    with open(out, "w") as f:
        f.write(f"# {share}\n")
        f.writelines(recs)
    impl.close()


class StallProbe:
    """One thread of this (otherwise idle) process per CPU, pinned to it, sleeping 1 ms at a time
    until ``end`` (monotonic ns), recording in ms how much later than asked it woke whenever
    that was over 2 ms: windows in which that CPU ran nothing of ours (the hypervisor ran
    something else). Any process on that CPU then (a waiter being woken, a holder, a Redis
    server) is that much late, whatever the library."""

    def __init__(self, end: int) -> None:
        self.end = end
        self.stalls: list[float] = []
        self.threads = [threading.Thread(target=self.run, args=(cpu,), daemon=True)
                        for cpu in sorted(os.sched_getaffinity(0))]
        for t in self.threads:
            t.start()

    def run(self, cpu: int) -> None:
        os.sched_setaffinity(0, {cpu})  # 0: the calling thread
        last = time.monotonic_ns()
        while last < self.end:
            time.sleep(0.001)
            now = time.monotonic_ns()
            late = (now - last) / 1e6 - 1.0
            if late > 2.0:
                self.stalls.append(late)  # list.append is atomic
            last = now

    def join(self) -> list[float]:
        for t in self.threads:
            t.join()
        return self.stalls


def run_delay_ns() -> int:
    """Time every thread of this process has spent runnable but not running (schedstat)."""
    total = 0
    for tid in tasks(os.getpid()):
        with contextlib.suppress(OSError, IndexError, ValueError), open(f"/proc/self/task/{tid}/schedstat") as f:
            total += int(f.read().split()[1])
    return total


@dataclass
class Rec:
    worker: int
    t0: int
    t1: int
    t2: int
    t3: int


def contended_one(args: argparse.Namespace, cls: type[Impl], n: int, servers: list[Server],
                  counter: Server, tmp: str) -> dict[str, object]:
    ctx = multiprocessing.get_context("spawn")
    key = f"ferrolock-bench:py:contended:{cls.name}:{n}"
    counter_key = f"ferrolock-bench:py:counter:{cls.name}:{n}"
    counter.client().delete(counter_key)
    ready = ctx.Queue()
    go = ctx.Event()
    start_end = ctx.Array("q", 2)
    looped = ctx.Barrier(args.workers)
    outs = [os.path.join(tmp, f"w{i}.log") for i in range(args.workers)]
    procs = [ctx.Process(target=worker, args=(cls.name, [s.url for s in servers[:n]], counter.port, key,
                                               counter_key, ready, go, start_end, looped, outs[i]))
             for i in range(args.workers)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=60)
    start = time.monotonic_ns() + 20_000_000
    start_end[0], start_end[1] = start, start + int(args.duration * 1e9)
    probe = StallProbe(start_end[1])
    go.set()
    deadline = time.monotonic() + args.duration + 60
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()
            raise RuntimeError(f"{cls.name}: worker pid {p.pid} did not finish; killed")
        if p.exitcode != 0:
            raise RuntimeError(f"{cls.name}: worker pid {p.pid} exited with {p.exitcode}")
    stalls = probe.join()
    recs = []
    cpu_wait = []
    for w, path in enumerate(outs):
        with open(path) as f:
            for line in f:
                if line.startswith("#"):
                    cpu_wait.append(float(line[1:]))
                else:
                    recs.append(Rec(w, *map(int, line.split())))
        os.remove(path)
    recs.sort(key=lambda r: r.t1)
    value = int(counter.client().get(counter_key) or 0)
    window_end = start + int(args.duration * 1e9)
    per = [0] * args.workers
    for r in recs:
        per[r.worker] += 1
    waits = sorted((r.t1 - r.t0) / 1e6 for r in recs)
    overlaps = sum(1 for a, b in zip(recs, recs[1:]) if b.t1 < a.t2)
    handoff = sorted((b.t1 - a.t2) / 1e3 for a, b in zip(recs, recs[1:]) if a.worker != b.worker)
    again = sorted((b.t1 - a.t2) / 1e3 for a, b in zip(recs, recs[1:]) if a.worker == b.worker)
    others = len(handoff)
    return {
        "name": cls.name, "nodes": n, "sections": len(recs),
        "per_sec": sum(1 for r in recs if r.t1 <= window_end) / args.duration,
        "per": per, "waits": waits, "overlaps": overlaps, "counter": value, "handoff": handoff,
        "again": again,
        "other_share": others / max(1, len(recs) - 1),
        "section": sorted((r.t2 - r.t1) / 1e3 for r in recs),
        "release": sorted((r.t3 - r.t2) / 1e3 for r in recs),
        "cpu_wait": statistics.mean(cpu_wait) if cpu_wait else float("nan"),
        "stall": max(stalls, default=0.0),
        "stalls": sum(1 for s in stalls if s >= 5.0),
    }


def contended(args: argparse.Namespace, servers: list[Server], counter: Server) -> tuple[str, list[str]]:
    place(os.sched_getaffinity(0), [os.getpid()] + [s.proc.pid for s in servers + [counter]])
    results = []
    with tempfile.TemporaryDirectory(prefix="ferrolock-bench-py-") as tmp:
        for cls, n in CONTENDED:
            if n not in args.nodes or (args.only and cls.name not in args.only):
                continue
            print(f"bench_peers: contended {cls.name} nodes={n}: {args.workers} processes for "
                  f"{args.duration} s", file=sys.stderr)
            results.append(contended_one(args, cls, n, servers, counter, tmp))
    rows = []
    for r in results:
        exact = r["counter"] == r["sections"]
        excl = (f"held ({num(r['counter'])} = counter)" if exact and r["overlaps"] == 0 else
                f"**VIOLATED**: {r['overlaps']} overlaps, counter {r['counter']} vs {r['sections']}")
        w, h = r["waits"], r["handoff"]
        rows.append([str(r["nodes"]), r["name"], num(r["per_sec"]), f"{num(min(r['per']))}–{num(max(r['per']))}",
                     f"{pct(w, 0.5):.2f}", f"{pct(w, 0.99):.2f}", f"{w[-1]:.2f}" if w else "-",
                     f"{pct(r['section'], 0.5):.0f}", f"{pct(r['release'], 0.5):.0f}",
                     f"{100 * r['other_share']:.0f} %", f"{pct(h, 0.5):.0f}" if h else "-",
                     f"{100 * r['cpu_wait']:.0f} %", f"{r['stall']:.1f} ({r['stalls']})", excl])
    verdicts = []
    by = {(r["name"], r["nodes"]): r for r in results}
    fl, rp = by.get((Ferrolock.name, 1)), by.get((RedisPyLock.name, 1))
    if fl and rp:
        worst = fl["waits"][-1] if fl["waits"] else float("nan")
        prl = by.get((PythonRedisLock.name, 1))
        prl_note = (f"; python-redis-lock's worst wait in this run {prl['waits'][-1]:.0f} ms, a tenth of it "
                    f"{prl['waits'][-1] / 10:.1f} ms") if prl and prl["waits"] else ""
        verdicts.append(
            f"1 node: ferrolock {num(fl['per_sec'])} sections/s vs redis-py Lock {num(rp['per_sec'])} "
            f"({'met' if fl['per_sec'] >= rp['per_sec'] else '**missed**'}); ferrolock worst wait {worst:.2f} ms "
            f"(target ≤ {TARGET_WORST_WAIT_MS:.0f} ms: {'met' if worst <= TARGET_WORST_WAIT_MS else '**missed**'}; "
            f"longest CPU stall in that run {fl['stall']:.1f} ms{prl_note})")
    fl5 = by.get((Ferrolock.name, 5))
    if fl5 and fl5["waits"]:
        verdicts.append(f"5 nodes: ferrolock worst wait {fl5['waits'][-1]:.2f} ms")
    notes = []
    for r in results:
        if r["name"] == Ferrolock.name and r["handoff"] and r["section"]:
            streak = (f"; in the others the releasing process took the lock back, "
                      f"{pct(r['again'], 0.5):.0f} µs from its release call (p50)") if r["again"] else ""
            notes.append(
                f"- ferrolock, {r['nodes']} node(s): {100 * r['other_share']:.0f} % of sections go to another "
                f"process, {pct(r['handoff'], 0.5):.0f} µs from the release call to the grant (p50){streak}; "
                f"sections {pct(r['section'], 0.5):.0f} µs (p50): {num(r['per_sec'])} sections/s.")
        elif r["waits"] and r["other_share"] < 0.5:
            notes.append(
                f"- {r['name']}, {r['nodes']} node(s): only {100 * r['other_share']:.0f} % of sections go to "
                f"another process: the releasing process mostly takes the lock again before a waiter gets it, "
                f"hence {num(r['per_sec'])} sections/s and a worst wait of "
                f"{r['waits'][-1]:.0f} ms.")
    header = [("nodes", "r"), ("library", "l"), ("sections/s", "r"), ("per proc min–max", "r"),
              ("wait p50 ms", "r"), ("wait p99 ms", "r"), ("wait max ms", "r"), ("section p50 µs", "r"),
              ("release p50 µs", "r"), ("to another proc", "r"), ("release→grant p50 µs", "r"),
              ("waiting for CPU", "r"), ("stall max ms (≥ 5 ms)", "r"), ("exclusion", "l")]
    text = table(header, rows,
                 f"**Contended** — {args.workers} processes, one key, {args.duration:g} s each; sections/s: "
                 "grants in the window ÷ its length; wait: acquire called → granted (capped by the window for "
                 "a process that never gets in until the others stop); section: granted → release called (GET + "
                 "SET, two round trips); release: the release call; to another proc: share of consecutive "
                 "sections held by different processes; release→grant: release called → next grant in another "
                 "process; waiting for CPU: time a worker's threads were runnable but not running (schedstat), "
                 "per second of its loop, averaged over the workers; stall: the longest time an idle thread "
                 "of the bench process pinned to one CPU (one per CPU), sleeping 1 ms at a time, woke later "
                 "than asked (that CPU ran nothing of ours: the hypervisor ran something else), and how "
                 "many such stalls reached 5 ms; a wait that overlaps one is that much longer, whatever "
                 "the library; exclusion: no overlapping [granted, "
                 "release called] intervals and the non-atomic "
                 "counter exact.")
    if notes:
        text += "\nWhere the contended time goes (medians):\n\n" + "\n".join(notes) + "\n"
    return text, verdicts


# --------------------------------------------------------------------------- main


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", help="write the markdown section here (also printed)")
    p.add_argument("--parts", default="uncontended,contended", help="uncontended,contended")
    p.add_argument("--pass", dest="passes", default="pinned,unpinned,split",
                   help="pinned (client and servers on --cpu), unpinned (the scheduler decides), split "
                        "(diagnostic: the client process on --cpu, the servers on another CPU)")
    p.add_argument("--cpu", type=int, default=0, help="the CPU of the pinned pass")
    p.add_argument("--nodes", default="1,5", help="node counts")
    p.add_argument("--runs", type=int, default=3, help="uncontended runs per library")
    p.add_argument("--ops", type=int, default=0, help="ops per uncontended run (default 2000 / 500 on 5 nodes)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--duration", type=float, default=3.0, help="seconds per contended configuration")
    p.add_argument("--only", default="", help="library names (comma separated), as in the tables")
    p.add_argument("--command", default="", help="the command line to record")
    args = p.parse_args()
    args.parts = [x for x in args.parts.split(",") if x]
    args.passes = [x for x in args.passes.split(",") if x]
    args.nodes = [int(x) for x in args.nodes.split(",") if x]
    args.only = [x for x in args.only.split(",") if x]
    for part in args.parts:
        if part not in ("uncontended", "contended"):
            p.error(f"unknown part {part!r}")
    for ps in args.passes:
        if ps not in ("pinned", "unpinned", "split"):
            p.error(f"unknown pass {ps!r}")
    if args.cpu not in os.sched_getaffinity(0):
        p.error(f"--cpu {args.cpu} is not in this process's CPU mask")

    started = time.monotonic()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    load_start = load()
    servers: list[Server] = []
    atexit.register(lambda: [stop_server(s) for s in servers])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(f"bench_peers: starting {max(args.nodes) + 1} redis-server(s)", file=sys.stderr)
    for _ in range(max(args.nodes) + 1):
        servers.append(start_server())
    nodes, counter = servers[:-1], servers[-1]
    redis_version = subprocess.run([shutil.which("redis-server") or "redis-server", "--version"],
                                   capture_output=True, text=True).stdout.split()
    redis_version_s = next((w[2:] for w in redis_version if w.startswith("v=")), "unknown")

    parts, verdicts = [], []
    if "uncontended" in args.parts:
        text, v = uncontended(args, nodes)
        parts.append(text)
        verdicts += v
    if "contended" in args.parts:
        text, v = contended(args, nodes, counter)
        parts.append(text)
        verdicts += v

    facts = [
        ("date", date),
        ("cpu", f"{cpu_model()} × {os.cpu_count()}"),
        ("python", f"{platform.python_implementation()} {platform.python_version()} ({sys.executable})"),
        ("libraries", ", ".join(f"{d} {version(d)}" for d in
                                ("ferrolock", "redis", "pottery", "python-redis-lock"))),
        ("redis-server", redis_version_s),
        ("load average at start / end", f"{load_start} / {load()}"),
        ("wall time", f"{time.monotonic() - started:.0f} s"),
        ("command", f"`{args.command or ' '.join([sys.executable] + sys.argv)}`"),
    ]
    out = ["## Python: ferrolock vs redis-py, pottery, python-redis-lock (issue 6)", ""]
    out += [f"- {k}: {v}" for k, v in facts]
    out += ["", (
        "Every library on the same redis-servers, with a 10 s ttl, used as its documentation shows: "
        "ferrolock `with manager.lock(key)` on a `LockManager` (restart guard off: the servers are seconds "
        "old; the explicit `acquire()`/`release()` row is a diagnostic), redis-py `with r.lock(key, timeout=10)`, "
        "python-redis-lock `with redis_lock.Lock(r, key, expire=10)`, pottery `with Redlock(...)` (one instance "
        "per key, reused), and redis-py by hand (`SET NX PX` + an `EVALSHA` compare-and-delete: the floor). "
        "Pinned: this process (every thread, ferrolock's runtime threads included) and every server on one "
        "CPU; unpinned: the scheduler decides; split (diagnostic): this process on one CPU, the servers on the "
        "other, so every round trip crosses CPUs. Contended runs are unpinned (several processes on 2 CPUs); "
        "each worker is a separate process (multiprocessing, spawn), blocking acquire with the library's "
        "default waiting."), ""]
    out += parts
    if verdicts:
        out += ["Targets (issue 6): " + "; ".join(verdicts) + ".", ""]
    text = "\n".join(out)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
