"""A client process of the fault harness, over the ferrolock Python package.

Run as ``python client.py CONFIG_JSON``. It is a separate OS process on purpose: the nemesis
pauses it with SIGSTOP (which pauses its watchdog too), kills it, interrupts it with SIGINT.

Two modes:
- scenario: reads one JSON command per line on stdin, runs it, answers one JSON line on stdout;
- chaos: runs a seeded random sequence of lock operations (see ``chaos_ops``) until told to
  stop, so that one seed replays the same operations.

Every operation is appended to the history file (JSON lines, times from ``time.monotonic()``,
which is CLOCK_MONOTONIC on Linux and so comparable across processes): ``t0`` when invoked, ``t1``
when complete. Deadline changes of held locks (renewals move them) are logged by a poller
thread, loss signals by the lock's loss callback.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ferrolock  # noqa: E402
from resource import ResourceClient  # noqa: E402


class History:
    def __init__(self, path: str, client: str) -> None:
        self.path, self.client = path, client
        self._mu = threading.Lock()
        self._f = open(path, "a", buffering=1)

    def reopen(self, client: str) -> None:
        """In a forked child: its own name and its own file object (same file, O_APPEND)."""
        self.client = client
        self._mu = threading.Lock()
        self._f = open(self.path, "a", buffering=1)

    def log(self, **ev: Any) -> None:
        ev.setdefault("client", self.client)
        ev.setdefault("pid", os.getpid())
        line = json.dumps(ev, sort_keys=True)
        with self._mu:
            self._f.write(line + "\n")


class Client:
    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.name = cfg["name"]
        self.hist = History(cfg["history"], self.name)
        opts = dict(cfg.get("manager", {}))
        self.manager = ferrolock.LockManager(cfg["nodes"], **opts)
        # A semaphore lives on one node: `semaphore_nodes` (one URL) gives it a manager of its
        # own beside the lock's N nodes.
        self.semaphores = ferrolock.LockManager(cfg["semaphore_nodes"], **opts) \
            if cfg.get("semaphore_nodes") else self.manager
        self.resource = ResourceClient(cfg["resource_port"]) if cfg.get("resource_port") else None
        self.handles: dict[str, dict] = {}
        self._mu = threading.Lock()
        self._stop = False
        threading.Thread(target=self._poll_deadlines, daemon=True).start()

    # --- bookkeeping -------------------------------------------------------------------------

    def _poll_deadlines(self) -> None:
        while not self._stop:
            with self._mu:
                live = [(h, e) for h, e in self.handles.items() if e["live"]]
            for h, e in live:
                lock = e["lock"]
                try:
                    if lock.status != "held":
                        continue
                    d = lock.deadline
                except Exception:
                    continue
                if abs(d - e["deadline"]) > 0.005:
                    e["deadline"] = d
                    self.hist.log(ev="deadline", h=h, key=e["key"], token=e["token"],
                                  episode=e["episode"], t=time.monotonic(), deadline=d)
            time.sleep(0.02)

    def _on_lost(self, h: str, entry: dict):
        def cb(reason: str) -> None:
            t = time.monotonic()
            try:
                d = entry["lock"].deadline
            except Exception:
                d = None
            self.hist.log(ev="lost", h=h, key=entry["key"], token=entry["token"],
                          episode=entry["episode"], t=t, reason=reason, deadline=d)
        return cb

    # --- operations --------------------------------------------------------------------------

    def acquire(self, h: str, key: str, opts: dict) -> dict:
        reentrant = bool(opts.get("reentrant"))
        # `side`: "read" or "write" takes that side of the read-write lock `key`; "semaphore"
        # takes `count` (default 1) permits of the semaphore `key`, a pool of `permits`.
        side = opts.get("side")
        t0 = time.monotonic()
        try:
            rest = {k: v for k, v in opts.items() if k not in ("side", "permits", "count")}
            if side is None:
                lock = self.manager.acquire(key, **opts)
            elif side == "semaphore":
                lock = self.semaphores.semaphore(key, permits=opts["permits"],
                                                 count=opts.get("count", 1), **rest).__enter__()
            else:
                lock = getattr(self.manager, f"{side}_lock")(key, **rest).__enter__()
        except BaseException as e:  # KeyboardInterrupt from a SIGINT too
            t1 = time.monotonic()
            self.hist.log(ev="acquire", h=h, key=key, t0=t0, t1=t1, ok=False,
                          err=type(e).__name__, msg=str(e)[:200], opts=opts)
            if isinstance(e, (SystemExit,)):
                raise
            return {"ok": False, "err": type(e).__name__, "msg": str(e)}
        t1 = time.monotonic()
        episode = f"{self.name}:{h}"
        if reentrant:
            with self._mu:
                for e in self.handles.values():
                    if e["live"] and e["key"] == key and e["token"] == lock.token:
                        episode = e["episode"]
                        break
        deadline = lock.deadline
        entry = {"lock": lock, "key": key, "token": lock.token, "fence": lock.fence,
                 "deadline": deadline, "episode": episode, "live": True}
        with self._mu:
            self.handles[h] = entry
        lock._notify_lost(self._on_lost(h, entry))
        self.hist.log(ev="acquire", h=h, key=key, t0=t0, t1=t1, ok=True, token=lock.token,
                      fence=lock.fence, deadline=deadline, ttl=lock.ttl, episode=episode,
                      reentrant=reentrant, opts=opts)
        return {"ok": True, "token": lock.token, "fence": lock.fence, "deadline": deadline}

    def release(self, h: str) -> dict:
        e = self.handles[h]
        t0 = time.monotonic()
        try:
            out = e["lock"].release()
            res = {"ok": True, "result": bool(out)}
        except BaseException as ex:
            res = {"ok": False, "err": type(ex).__name__, "msg": str(ex)[:200]}
        t1 = time.monotonic()
        e["live"] = False
        self.hist.log(ev="release", h=h, key=e["key"], token=e["token"], episode=e["episode"],
                      t0=t0, t1=t1, **res)
        return res

    def extend(self, h: str, ttl: float | None) -> dict:
        e = self.handles[h]
        t0 = time.monotonic()
        try:
            v = e["lock"].extend(ttl) if ttl is not None else e["lock"].extend()
            d = e["lock"].deadline
            e["deadline"] = d
            res = {"ok": True, "validity": v, "deadline": d}
        except BaseException as ex:
            res = {"ok": False, "err": type(ex).__name__, "msg": str(ex)[:200]}
        t1 = time.monotonic()
        self.hist.log(ev="extend", h=h, key=e["key"], token=e["token"], episode=e["episode"],
                      t0=t0, t1=t1, ttl=ttl, **res)
        return res

    def rmw(self, h: str, mode: str, sleep: float = 0.0, gate: str | None = None) -> dict:
        """Read the counter, (work), write it + 1 with this grant's fence or token. With a
        `gate` path, the work lasts until that file exists (a test's interleaving, not a
        guess at how long another client takes), at most 120 s."""
        assert self.resource is not None
        e = self.handles[h]
        t0 = time.monotonic()
        try:
            v = self.resource.read(e["key"], mode, e["fence"])
            self.hist.log(ev="read", h=h, key=e["key"], episode=e["episode"],
                          t=time.monotonic(), read=v)
            if v is None:
                t1 = time.monotonic()
                self.hist.log(ev="write", h=h, key=e["key"], token=e["token"],
                              episode=e["episode"], fence=e["fence"], mode=mode, t0=t0, tw=t1,
                              t1=t1, ok=True, applied=False, read=None, read_refused=True)
                return {"ok": True, "applied": False, "read": None}
            if sleep:
                time.sleep(sleep)
            if gate is not None:
                give_up = time.monotonic() + 120
                while not os.path.exists(gate) and time.monotonic() < give_up:
                    time.sleep(0.01)
            t_write = time.monotonic()
            ok = self.resource.write(mode, self.name, e["fence"], v, v + 1, e["key"], e["token"])
            res = {"ok": True, "applied": ok, "read": v}
        except BaseException as ex:
            t_write = time.monotonic()
            res = {"ok": False, "err": type(ex).__name__, "msg": str(ex)[:200]}
        t1 = time.monotonic()
        self.hist.log(ev="write", h=h, key=e["key"], token=e["token"], episode=e["episode"],
                      fence=e["fence"], mode=mode, t0=t0, tw=t_write, t1=t1, **res)
        return res

    def broken_acquire(self, h: str, key: str, node_port: int, ttl: float) -> dict:
        """A deliberately broken lock, for the checker's own test: SET without NX, so it
        overwrites whoever holds the key and always "succeeds"."""
        import redis

        token = f"broken-{self.name}-{h}"
        t0 = time.monotonic()
        redis.Redis(port=node_port).set(key, token, px=int(ttl * 1000))
        t1 = time.monotonic()
        deadline = t0 + ttl * 0.99 - 0.002
        episode = f"{self.name}:{h}"
        self.handles[h] = {"lock": None, "key": key, "token": token, "fence": None,
                           "deadline": deadline, "episode": episode, "live": False}
        self.hist.log(ev="acquire", h=h, key=key, t0=t0, t1=t1, ok=True, token=token,
                      fence=None, deadline=deadline, ttl=ttl, episode=episode, reentrant=False,
                      opts={"broken": True})
        return {"ok": True, "token": token, "deadline": deadline}

    def status(self, h: str) -> dict:
        lock = self.handles[h]["lock"]
        return {"ok": True, "status": lock.status, "lost": lock.lost,
                "reason": lock.loss_reason, "deadline": lock.deadline}

    def run_command(self, cmd: dict) -> dict:
        op = cmd.pop("op")
        if op == "acquire":
            return self.acquire(cmd["h"], cmd["key"], cmd.get("opts", {}))
        if op == "release":
            return self.release(cmd["h"])
        if op == "extend":
            return self.extend(cmd["h"], cmd.get("ttl"))
        if op == "rmw":
            return self.rmw(cmd["h"], cmd["mode"], cmd.get("sleep", 0.0), cmd.get("gate"))
        if op == "broken_acquire":
            return self.broken_acquire(cmd["h"], cmd["key"], cmd["port"], cmd["ttl"])
        if op == "status":
            return self.status(cmd["h"])
        if op == "sleep":
            time.sleep(cmd["s"])
            return {"ok": True}
        if op == "ping":
            return {"ok": True, "pid": os.getpid()}
        return {"ok": False, "err": "UnknownOp", "msg": op}

    # --- modes -------------------------------------------------------------------------------

    def serve(self) -> None:
        for line in sys.stdin:
            line = line.strip()
            if not line:
                continue
            cmd = json.loads(line)
            if cmd.get("op") == "exit":
                break
            try:
                out = self.run_command(cmd)
            except Exception as e:  # a harness bug: answer rather than hang the scenario
                out = {"ok": False, "err": type(e).__name__, "msg": str(e)}
            sys.stdout.write(json.dumps(out) + "\n")
            sys.stdout.flush()
        self._stop = True

    def chaos(self) -> None:
        from chaos_ops import run_client

        run_client(self, random.Random(self.cfg["seed"]), self.cfg["until"])
        self._stop = True


def main() -> None:
    cfg = json.loads(sys.argv[1])
    if cfg.get("mode") == "chaos":
        # SIGINT cancels the call in flight (KeyboardInterrupt), then the run goes on.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    client = Client(cfg)
    if cfg.get("mode") == "chaos":
        client.chaos()
    else:
        sys.stdout.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
        sys.stdout.flush()
        client.serve()
    os._exit(0)


if __name__ == "__main__":
    main()
