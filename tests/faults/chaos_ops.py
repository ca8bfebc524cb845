"""The operations of a chaos client: a seeded random mix of every kind of lock and every way a
call can end. One ``random.Random(seed)`` draws the whole sequence, so a seed replays the same
operations (their timing, and so their outcomes, depends on the machine and the faults).

Kinds: plain (no watchdog: the ttl bounds the hold), reentrant nested holds with different ttls
(released inner first, or outer first), watchdog-held for longer than the ttl, try-locks
(``wait=0``), short waits that time out, and forks (the child must see the parent's lock as
not its own, and takes a try-lock of its own). Every lock grant is fenced and its work is a
fenced read-modify-write of the resource. A SIGINT from the nemesis cancels the call in flight
(KeyboardInterrupt); the client then releases what it holds and goes on.

The read-write lock ``rw`` (on the lock's nodes): readers (sometimes re-entered, sometimes held
past their ttl by the watchdog) only hold; writers (fenced, sometimes re-entered) do the fenced
read-modify-write; a downgrade takes the read lock under its own write lock, then releases
the write lock first (the read hold stays) or last. The semaphore ``sem`` (a pool of
``PERMITS``, on ONE node: the client's ``semaphore_nodes``, since a semaphore refuses N > 1):
holders of 1 or 2 permits, some held past their lease by the watchdog.
"""

from __future__ import annotations

import os
import random
import time

KEYS = ["c0", "c1", "c2"]
RW_KEY, SEM_NAME, PERMITS = "rw", "sem", 3
# "permits" twice: the pool of 3 is full often enough for an over-grant to show.
KINDS = ["plain", "reentrant", "watchdog", "try", "short_wait", "fork", "read", "write",
         "downgrade", "permits", "permits"]


def _ttl(rng: random.Random) -> float:
    return round(rng.uniform(3.0, 6.0), 2)


def draw(rng: random.Random) -> tuple[str, str, dict]:
    """The next operation: its kind, its key (the kinds of the read-write lock and of the
    semaphore use their own) and its plan, every draw made whatever the kind."""
    kind = rng.choice(KINDS)
    key = rng.choice(KEYS)
    plan = {"ttl": _ttl(rng), "ttl2": _ttl(rng), "hold": rng.uniform(0.0, 1.0),
            "long_hold": rng.uniform(2.0, 8.0), "outer_first": rng.random() < 0.3,
            "extend": rng.random() < 0.3, "pause": rng.uniform(0.05, 0.5),
            "long": rng.random() < 0.25, "count": rng.choice([1, 2])}
    if kind in ("read", "write", "downgrade"):
        key = RW_KEY
    elif kind == "permits":
        key = SEM_NAME
    return kind, key, plan


def run_client(c, rng: random.Random, until: float) -> None:
    n = 0
    while time.monotonic() < until:
        n += 1
        kind, key, plan = draw(rng)
        hname = f"{kind}{n}"
        try:
            _one(c, kind, key, hname, plan)
        except KeyboardInterrupt:
            c.hist.log(ev="interrupted", h=hname, t=time.monotonic(), kind=kind)
        except Exception as e:  # a harness bug must not stop the run: log it
            c.hist.log(ev="client_error", h=hname, t=time.monotonic(), err=type(e).__name__,
                       msg=str(e)[:200])
        _release_live(c)
        time.sleep(plan["pause"])


def _release_live(c) -> None:
    for h, e in list(c.handles.items()):
        if e["live"]:
            try:
                c.release(h)
            except KeyboardInterrupt:
                c.release(h)


def _work(c, h: str, hold: float) -> None:
    e = c.handles[h]
    if e["lock"].locked():
        c.rmw(h, "fenced")
    time.sleep(hold)


def _hold(c, h: str, p: dict, work: bool) -> None:
    """A shared hold (read, permits) only holds; a write works. A long hold lasts past the
    ttl (the watchdog renews it) while the hold is not lost."""
    step = (lambda: _work(c, h, 0.5)) if work else (lambda: time.sleep(0.5))
    if not p["long"]:
        if work:
            _work(c, h, p["hold"])
        else:
            time.sleep(p["hold"])
        return
    end = time.monotonic() + p["long_hold"]
    while time.monotonic() < end and c.handles[h]["lock"].locked():
        step()


def _one(c, kind: str, key: str, h: str, p: dict) -> None:
    base = {"fencing": True}
    if kind == "plain":
        if c.acquire(h, key, dict(base, ttl=p["ttl"], watchdog=False, wait=5.0))["ok"]:
            _work(c, h, p["hold"])
            if p["extend"]:
                c.extend(h, p["ttl2"])
            c.release(h)
    elif kind == "reentrant":
        opts = dict(base, reentrant=True, wait=5.0)
        if not c.acquire(h, key, dict(opts, ttl=p["ttl"]))["ok"]:
            return
        inner = h + "i"
        if c.acquire(inner, key, dict(opts, ttl=p["ttl2"]))["ok"]:
            _work(c, inner, p["hold"])
            if p["extend"]:
                c.extend(inner, p["ttl"])
            if p["outer_first"]:
                c.release(h)
                _work(c, inner, 0.0)
                c.release(inner)
            else:
                c.release(inner)
                _work(c, h, 0.0)
                c.release(h)
        else:
            c.release(h)
    elif kind == "watchdog":
        if c.acquire(h, key, dict(base, ttl=3.0, wait=5.0))["ok"]:
            _hold(c, h, dict(p, long=True), True)
            c.release(h)
    elif kind == "try":
        if c.acquire(h, key, dict(base, ttl=p["ttl"], wait=0.0))["ok"]:
            _work(c, h, p["hold"])
            c.release(h)
    elif kind == "short_wait":
        if c.acquire(h, key, dict(base, ttl=p["ttl"], wait=0.2))["ok"]:
            _work(c, h, p["hold"])
            c.release(h)
    elif kind in ("read", "write"):
        # Writers are fenced (readers get no fence); the inner hold re-enters the same side.
        opts = dict(base if kind == "write" else {}, side=kind, ttl=p["ttl"], wait=5.0)
        if not c.acquire(h, key, opts)["ok"]:
            return
        inner = h + "i"
        if p["extend"] and c.acquire(inner, key, dict(opts, ttl=p["ttl2"], reentrant=True))["ok"]:
            _hold(c, inner, p, kind == "write")
            c.release(inner)
        else:
            _hold(c, h, p, kind == "write")
        c.release(h)
    elif kind == "downgrade":
        # The read hold under the writer's own write hold is an episode of its own: it may
        # outlive the write hold, and then other readers share it.
        if not c.acquire(h, key, dict(base, side="write", ttl=p["ttl"], wait=5.0))["ok"]:
            return
        _work(c, h, p["hold"])
        read = h + "r"
        if c.acquire(read, key, {"side": "read", "ttl": p["ttl2"], "wait": 5.0})["ok"]:
            if not p["outer_first"]:
                c.release(h)
                _hold(c, read, p, False)
                c.release(read)
            else:
                c.release(read)
                c.release(h)
        else:
            c.release(h)
    elif kind == "permits":
        opts = {"side": "semaphore", "permits": PERMITS, "count": p["count"], "ttl": p["ttl"],
                "wait": 5.0}
        if c.acquire(h, key, opts)["ok"]:
            _hold(c, h, p, False)
            c.release(h)
    elif kind == "fork":
        if not c.acquire(h, key, dict(base, ttl=p["ttl"], wait=5.0))["ok"]:
            return
        pid = os.fork()
        if pid == 0:
            _forked_child(c, h, key, p)
        _, status = os.waitpid(pid, 0)
        c.hist.log(ev="fork_done", h=h, t=time.monotonic(), status=status)
        _work(c, h, p["hold"])
        c.release(h)


def _forked_child(c, h: str, key: str, p: dict) -> None:
    code = 0
    try:
        c.name = f"{c.name}/fork{os.getpid()}"
        c.hist.reopen(c.name)
        inherited = c.handles[h]["lock"]
        if inherited.locked():
            c.hist.log(ev="fork_inherited_held", h=h, t=time.monotonic())
            code = 3
        with c._mu:
            for e in c.handles.values():
                e["live"] = False  # the parent's: never released by the child
        other = KEYS[(KEYS.index(key) + 1) % len(KEYS)]
        ch = h + "f"
        if c.acquire(ch, other, {"fencing": True, "ttl": p["ttl"], "wait": 0.0,
                                 "watchdog": False})["ok"]:
            _work(c, ch, 0.1)
            c.release(ch)
    except BaseException:
        code = 4
    os._exit(code)
