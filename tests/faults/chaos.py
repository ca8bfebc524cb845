"""The randomized chaos run: 5 nodes, 6 client processes (chaos_ops.py) and a nemesis drawing
random faults, all from one seed; then the checker, and a markdown report. Locks and the
read-write lock use the 5 nodes; the semaphore lives on one node, n0 (``SEM_NODE``), through
each client's own link to it, so n0's faults and its links' faults hit it too.

    python tests/faults/chaos.py --duration 60 --seed 7 [--out DIR]

It prints its seed first. The same seed replays the same schedule: each client's operations
come from ``Random(seed * 1000 + i)`` and the nemesis' faults (kind, target, start, length)
from ``Random(seed)``, drawn up front. Exit status 0 when the checker found no violation
outside the documented limits, 1 otherwise.

Faults, one at a time with a gap after each: SIGSTOP of a client (sometimes past its ttl),
SIGKILL of a client (a fresh one takes its place), SIGINT to a client (cancels the call in
flight), SIGSTOP of a node, SIGKILL of a node then a restart without persistence (the restart
guard, 8 s, covers the longest ttl, 6 s), a restart with persistence, and on one client's link
to one node: a cut, a blackhole, a delay in one direction, replies held then released. The
guard holds the semaphore's node back too (its acquire is a voting request), so a restart of
n0 without persistence cannot over-grant the pool while a forgotten holder's lease runs (K10's
documented over-grant is without the guard): every over-grant counts as a violation.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from checker import check  # noqa: E402
from harness import (HERE, FaultLog, Nemesis, Node, ProxyHub, proc_state,  # noqa: E402
                     read_history, wait_until)
from report import render  # noqa: E402
from resource import read_log  # noqa: E402

N_NODES, N_CLIENTS = 5, 6
SEM_NODE = 0
GUARD = 8.0
FAULT_KINDS = ["pause_client", "kill_client", "sigint_client", "pause_node", "restart_node",
               "restart_node_persistent", "link_cut", "link_blackhole", "link_delay",
               "link_hold"]


def schedule(seed: int, duration: float) -> list[dict]:
    rng = random.Random(seed)
    out, t = [], 1.0 + GUARD
    while True:
        t += rng.uniform(1.0, 4.0)
        kind = rng.choice(FAULT_KINDS)
        f = {"at": round(t, 3), "kind": kind, "client": rng.randrange(N_CLIENTS),
             "node": rng.randrange(N_NODES), "dir": rng.choice(["up", "down"]),
             "ms": rng.choice([50, 150, 400])}
        f["length"] = round({"pause_client": rng.uniform(0.5, 8.0),
                             "pause_node": rng.uniform(0.3, 3.0)}.get(kind, rng.uniform(0.5, 5.0)), 3)
        if kind in ("kill_client", "sigint_client", "restart_node", "restart_node_persistent"):
            f["length"] = 0.0
        if t + f["length"] > duration - 2:
            return out
        out.append(f)
        t += f["length"]


class Chaos:
    def __init__(self, seed: int, duration: float, out: Path) -> None:
        self.seed, self.duration, self.out = seed, duration, out
        self.history = str(out / "history.jsonl")
        self.faults = FaultLog(str(out / "faults.jsonl"))
        self.hub = ProxyHub()
        self.nemesis = Nemesis(self.faults, self.hub)
        self.nodes = [Node(f"n{i}") for i in range(N_NODES)]
        self.nodes.append(Node("resource"))
        self.resource = self.nodes.pop()
        self.proxies: dict[tuple[int, int], int] = {}
        self.urls: dict[int, list[str]] = {}
        for c in range(N_CLIENTS):
            urls = []
            for i, n in enumerate(self.nodes):
                pid, port = self.hub.new(n.port)
                self.proxies[(c, i)] = pid
                urls.append(f"redis://127.0.0.1:{port}")
            self.urls[c] = urls
        self.procs: dict[int, subprocess.Popen] = {}
        self.generation = {c: 0 for c in range(N_CLIENTS)}

    def spawn(self, c: int) -> None:
        name = f"C{c}" + (f".{self.generation[c]}" if self.generation[c] else "")
        cfg = {"name": name, "nodes": self.urls[c], "semaphore_nodes": [self.urls[c][SEM_NODE]],
               "history": self.history,
               "resource_port": self.resource.port, "manager": {"restart_guard": GUARD},
               "mode": "chaos", "seed": self.seed * 1000 + c * 10 + self.generation[c],
               "until": self.t0 + self.duration}
        self.procs[c] = subprocess.Popen([sys.executable, str(HERE / "client.py"), json.dumps(cfg)],
                                         stdin=subprocess.DEVNULL)

    def name(self, c: int) -> str:
        return f"C{c}" + (f".{self.generation[c]}" if self.generation[c] else "")

    def run(self) -> dict:
        plan = schedule(self.seed, self.duration)
        (self.out / "schedule.json").write_text(json.dumps(plan, indent=1))
        self.t0 = time.monotonic()
        for c in range(N_CLIENTS):
            self.spawn(c)
        for f in plan:
            delay = self.t0 + f["at"] - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            try:
                self.inject(f)
            except Exception as e:  # a fault that could not be injected is reported, not hidden
                self.faults.log(fault="nemesis_error", target=f["kind"], start=time.monotonic(),
                                end=time.monotonic(), err=f"{type(e).__name__}: {e}")
        rest = self.t0 + self.duration - time.monotonic()
        if rest > 0:
            time.sleep(rest)
        for p in self.procs.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        t_end = time.monotonic()
        hist = read_history(self.history)
        report = check(hist, self.faults.read(), read_log(self.resource.port), t_end=t_end)
        report["seed"], report["duration"] = self.seed, self.duration
        return report

    def inject(self, f: dict) -> None:
        nem, kind, c = self.nemesis, f["kind"], f["client"]
        node = self.nodes[f["node"]]
        proc = self.procs[c]
        if kind == "pause_client":
            if proc.poll() is not None:
                return
            os.kill(proc.pid, signal.SIGSTOP)
            wait_until("client stopped", lambda: proc_state(proc.pid) in ("T", None))
            fid = nem._start("pause_client", self.name(c), pid=proc.pid)
            time.sleep(f["length"])
            t = time.monotonic()
            os.kill(proc.pid, signal.SIGCONT)
            nem._end(fid, t)
        elif kind == "kill_client":
            t = time.monotonic()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            nem._instant("kill_client", self.name(c), t, pid=proc.pid)
            self.generation[c] += 1
            self.spawn(c)
        elif kind == "sigint_client":
            t = time.monotonic()
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGINT)
            nem._instant("sigint_client", self.name(c), t, pid=proc.pid)
        elif kind == "pause_node":
            fid = nem.pause_node(node)
            time.sleep(f["length"])
            nem.resume_node(node, fid)
        elif kind == "restart_node":
            nem.restart_node(node, keep_data=False)
        elif kind == "restart_node_persistent":
            # Keeps its data by a SAVE just before the kill: a restart with persistence.
            node.client().save()
            t = time.monotonic()
            old = node.pid
            node.restart(keep_data=True)
            nem._instant("restart_node_persistent", node.name, t, old_pid=old, pid=node.pid)
        else:
            pid = self.proxies[(c, f["node"])]
            target = f"{self.name(c)}->{node.name}"
            cmds = {"link_cut": ["cut"], "link_blackhole": ["blackhole"],
                    "link_delay": [f"delay {f['dir']} {f['ms']}"],
                    "link_hold": [f"hold {f['dir']}"]}[kind]
            fid = nem.link(kind, pid, target, *cmds)
            time.sleep(f["length"])
            nem.heal(pid, fid, "heal")

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
                p.wait()
        for n in self.nodes + [self.resource]:
            n.stop()
        self.hub.stop()


VIOLATIONS = ("overlaps", "over_granted", "fence_violations", "lost_updates", "non_owner_touch",
              "fork_inherited_held", "client_errors")


def violations(report: dict) -> dict:
    v = {k: len(report[k]) for k in VIOLATIONS}
    v["late_signals"] = len(report["signals"]["late"])
    v["missing_signals"] = len(report["signals"]["missing"])
    return {k: n for k, n in v.items() if n}


def duration(text: str) -> float:
    """Seconds, or with a unit: 90s, 10m, 1h."""
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        if text and text[-1] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"duration {text!r} is not like 60, 90s, 10m or 1h")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=duration, default=60.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1 << 31)
    print(f"chaos: seed {seed}, duration {a.duration:.0f}s", flush=True)
    out = Path(a.out or HERE.parent.parent / "target" / "chaos" / f"seed-{seed}-{int(time.time())}")
    out.mkdir(parents=True, exist_ok=True)
    chaos = Chaos(seed, a.duration, out)
    try:
        report = chaos.run()
    finally:
        chaos.close()
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    md = render(report, violations(report), out)
    (out / "report.md").write_text(md)
    print(md)
    print(f"chaos: artifacts in {out} (history.jsonl, faults.jsonl, schedule.json, report.md)")
    return 1 if violations(report) else 0


if __name__ == "__main__":
    sys.exit(main())
