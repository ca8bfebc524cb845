"""Interpreter exit with locks still held does not hang, and releases them."""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path

import pytest

import ferrolock
from conftest import Child, RedisNode

HOLDER = r"""
import asyncio, sys, threading, time, ferrolock
url, key = sys.argv[1], sys.argv[2]
m = ferrolock.LockManager([url], ttl=30)
held = m.acquire(key + ":explicit")

def in_with():
    with ferrolock.redlock(key + ":with", nodes=[url], ttl=30):
        time.sleep(1000)

threading.Thread(target=in_with, daemon=True).start()

def waiting():
    # blocked in an acquire that will never succeed while the process exits
    m.acquire(key + ":explicit")

threading.Thread(target=waiting, daemon=True).start()

async def async_holder():
    lock = await m.acquire_async(key + ":async")
    return lock

keep = asyncio.run(async_holder())
time.sleep(0.3)
print("holding", flush=True)
"""


def test_exit_with_held_locks_does_not_hang_and_releases(node: RedisNode, key: str) -> None:
    child = Child(HOLDER, node.url, key)
    try:
        child.expect("holding")
        t = time.monotonic()
        assert child.wait(15) == 0, "".join(child.err)
        assert time.monotonic() - t < 10
        r = node.client()
        for suffix in (":explicit", ":with", ":async"):
            assert not r.exists(key + suffix), suffix
    finally:
        child.kill()


def test_a_daemon_thread_waiting_at_exit_ends_quietly(node: RedisNode, key: str) -> None:
    # Its wait raises SystemExit (chained from NotAcquired, "the process is exiting"), which
    # threading ignores: the thread unwinds without a traceback during finalization. The main
    # thread's exit handlers still get NotAcquired (the README's rule).
    code = r"""
import atexit, sys, threading, time
url, key = sys.argv[1], sys.argv[2]
def late():
    # Runs after ferrolock's exit handler (registered before its import): the waiting thread
    # has been woken by then and ends (with a traceback on stderr, were its error printed);
    # an acquire here is refused.
    waiter.join(30)
    print("waiter ended:", not waiter.is_alive(), flush=True)
    try:
        m.acquire(key + ":handler")
    except ferrolock.NotAcquired as e:
        print("handler:", e, flush=True)
    print("late handler ran", flush=True)
atexit.register(late)
import ferrolock
m = ferrolock.LockManager([url], ttl=30)
held = m.acquire(key)
def waiting():
    try:
        with ferrolock.redlock(key, nodes=[url], ttl=30):
            print("never", flush=True)
    finally:
        print("unwound", flush=True)
waiter = threading.Thread(target=waiting, daemon=True)
waiter.start()
# Exit only once the thread is waiting: its first try has been refused (an attempt counted
# beside the grant of `held`).
prefix = key.rsplit(":", 1)[0] if ":" in key else key
while ferrolock.metrics().get(prefix, {}).get("attempts", 0) < 2:
    time.sleep(0.01)
print("exiting", flush=True)
"""
    child = Child(code, node.url, key)
    try:
        child.expect("exiting")
        child.expect("unwound")
        child.expect("waiter ended: True")
        child.expect("handler: ", prefix=True)
        child.expect("late handler ran")
        assert child.wait(15) == 0, "".join(child.err)
        assert not any("Traceback" in line or "NotAcquired" in line for line in child.err), "".join(child.err)
        assert not node.client().exists(key)
    finally:
        child.kill()


def test_a_daemon_threads_event_loop_awaiting_at_exit_ends_quietly(node: RedisNode, key: str) -> None:
    # As a blocking wait there (the test above): an awaited acquire, and an `async with`
    # waiting for its lock, in an event loop run by a daemon thread, raise SystemExit (chained
    # from NotAcquired) at exit. It leaves the loop, and threading ignores it; a NotAcquired
    # was printed as "Exception in thread ..." during finalization, cut off as the process ended.
    code = r"""
import asyncio, atexit, sys, threading, time
url, key = sys.argv[1], sys.argv[2]
def late():
    for waiter in waiters:
        waiter.join(30)
    print("waiters ended:", not any(w.is_alive() for w in waiters), flush=True)
atexit.register(late)
import ferrolock
m = ferrolock.LockManager([url], ttl=30)
held = m.acquire(key)
async def awaiting(name, start):
    try:
        await start()
        print("never", flush=True)
    finally:
        sys.stdout.write(f"{name} unwound\n")  # one write: the two threads print at once
async def in_with():
    async with m.lock(key):
        pass
calls = [("acquire_async", lambda: m.acquire_async(key)), ("async with", in_with)]
waiters = [threading.Thread(target=asyncio.run, args=(awaiting(*c),), daemon=True) for c in calls]
for waiter in waiters:
    waiter.start()
# Exit only once both wait: their first tries have been refused (attempts counted beside the
# grant of `held`).
prefix = key.rsplit(":", 1)[0] if ":" in key else key
while ferrolock.metrics().get(prefix, {}).get("attempts", 0) < 3:
    time.sleep(0.01)
print("exiting", flush=True)
"""
    child = Child(code, node.url, key)
    try:
        child.expect("exiting")
        child.expect("waiters ended: True")
        assert child.wait(15) == 0, "".join(child.err)
        assert {"acquire_async unwound", "async with unwound"} <= set(child.out), child.out
        assert not any("Traceback" in line or "NotAcquired" in line for line in child.err), "".join(child.err)
        assert not node.client().exists(key)
    finally:
        child.kill()


def test_an_exit_handler_after_ferrolocks_awaits_as_it_blocks(node: RedisNode, key: str) -> None:
    # A handler registered before the import runs after ferrolock's exit: its awaited calls
    # end as the blocking ones do (an acquire is refused, a release finds the lock released),
    # and a timeout around them still works. They used to hang for good, and the process with
    # them: no library thread may enter Python by then, so their results never reached the loop.
    code = r"""
import asyncio, atexit, sys
url, key = sys.argv[1], sys.argv[2]
async def calls():
    for name, call in [
        ("acquire", lambda: m.acquire_async(key + ":new", wait=1)),
        ("async with", lambda: m.lock(key + ":with", wait=1).__aenter__()),
        ("release", lambda: held.release_async()),
        ("extend", lambda: held.extend_async()),
        ("wait_lost", lambda: held.wait_lost()),
    ]:
        try:
            print(name, "->", repr(await asyncio.wait_for(call(), 30)), flush=True)
        except TimeoutError:
            print(name, "-> timed out", flush=True)
        except ferrolock.LockError as e:
            print(name, "->", type(e).__name__, e, flush=True)
    # Left pending: cancelled by the timeout, the loop is not held up.
    try:
        await asyncio.wait_for(asyncio.get_running_loop().create_future(), 0.1)
    except TimeoutError:
        print("timeout works", flush=True)
def late():
    asyncio.run(calls())
    print("late handler ran", flush=True)
atexit.register(late)
import ferrolock
m = ferrolock.LockManager([url], ttl=30)
held = m.acquire(key)
print("exiting", flush=True)
"""
    child = Child(code, node.url, key)
    try:
        child.expect("exiting")
        child.expect("acquire -> NotAcquired ", prefix=True)
        assert "the process is exiting" in child.out[-1], child.out
        child.expect("async with -> NotAcquired ", prefix=True)
        assert "the process is exiting" in child.out[-1], child.out
        child.expect("release -> NotHeld ", prefix=True)
        child.expect("extend -> NotHeld ", prefix=True)
        child.expect("wait_lost -> None")
        child.expect("timeout works")
        child.expect("late handler ran")
        assert child.wait(15) == 0, "".join(child.err)
        assert not any("Traceback" in line for line in child.err), "".join(child.err)
        r = node.client()
        assert not r.exists(key) and not r.exists(key + ":new") and not r.exists(key + ":with")
    finally:
        child.kill()


def test_async_with_a_manager_in_an_exit_handler_closes_it(node: RedisNode, key: str) -> None:
    # An exit handler (here run before ferrolock's) can start no executor thread; the end of
    # `async with LockManager(...)` raised RuntimeError ("can't register atexit after
    # shutdown") there, and left the manager open, its lock held.
    code = r"""
import asyncio, atexit, sys, ferrolock
url, key = sys.argv[1], sys.argv[2]
async def cleanup():
    async with ferrolock.LockManager([url], ttl=30) as m:
        held = await m.acquire_async(key)
        print("held", held.status, flush=True)
    # Free now, not at ferrolock's own exit (which runs after this handler).
    again = ferrolock.LockManager([url]).acquire(key, wait=0)
    print("closed", m.closed, again.release(), flush=True)
def handler():
    try:
        asyncio.run(cleanup())
    except BaseException as e:
        print("handler raised", type(e).__name__, e, flush=True)
atexit.register(handler)
print("exiting", flush=True)
"""
    child = Child(code, node.url, key)
    try:
        child.expect("exiting")
        child.expect("held held")
        child.expect_prefix("closed")
        assert child.out[-1] == "closed True True", child.out
        assert child.wait(15) == 0, "".join(child.err)
        assert not node.client().exists(key)
    finally:
        child.kill()


def test_exit_from_inside_a_with_block(node: RedisNode, key: str) -> None:
    code = r"""
import sys, ferrolock
with ferrolock.redlock(sys.argv[2], nodes=[sys.argv[1]], ttl=30):
    print("inside", flush=True)
    sys.exit(3)
"""
    child = Child(code, node.url, key)
    try:
        child.expect("inside")
        assert child.wait(15) == 3
        assert not node.client().exists(key)
    finally:
        child.kill()


SIGTERM_HOLDER = r"""
import signal, sys, time, ferrolock
if sys.argv[3] == "handled":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # the README's recipe
with ferrolock.redlock(sys.argv[2], nodes=[sys.argv[1]], ttl=30):
    print("inside", flush=True)
    time.sleep(60)
"""


@pytest.mark.parametrize("handled", [False, True], ids=["default", "handled"])
def test_sigterm_releases_only_through_the_readmes_handler(node: RedisNode, key: str, handled: bool) -> None:
    """Python's default SIGTERM (docker stop, systemd, Kubernetes) ends the process without
    running `with` exits, so the lock is left to its ttl, as the README says; the recipe it
    gives turns SIGTERM into an exit, which releases."""
    child = Child(SIGTERM_HOLDER, node.url, key, "handled" if handled else "default")
    try:
        child.expect("inside")
        child.proc.send_signal(signal.SIGTERM)
        code = child.wait(15)
        if handled:
            assert code == 143, "".join(child.err)
            assert not node.client().exists(key)
        else:
            assert code == -signal.SIGTERM
            assert node.client().pttl(key) > 20_000
            node.client().delete(key)
    finally:
        child.kill()


ASYNC_THEN_EXIT = r"""
import asyncio, sys, ferrolock
m = ferrolock.LockManager([sys.argv[1]])

async def main():
    for _ in range(200):
        async with m.lock(sys.argv[2]):
            pass
    lock = await m.acquire_async(sys.argv[2] + ":kept")   # still held at exit
    asyncio.get_running_loop().call_soon(lambda: None)

asyncio.run(main())
print("done", flush=True)
"""


def test_exit_right_after_asyncio_use_never_crashes(node: RedisNode, key: str) -> None:
    """Results handed to the event loop from background threads while the interpreter
    finalizes used to abort the process (a thread re-taking the GIL during finalization is
    ended with pthread_exit, whose unwind through Rust frames aborts)."""
    for _ in range(6):
        child = Child(ASYNC_THEN_EXIT, node.url, key)
        try:
            assert child.wait(30) == 0, "".join(child.err)
        finally:
            child.kill()
    assert not node.client().exists(key + ":kept")


LOOPER = r"""
import os, sys, time, ferrolock
url, key, go = sys.argv[1], sys.argv[2], sys.argv[3]
m = ferrolock.LockManager([url], ttl=30, restart_guard=0, watchdog=False)
# m meets contention on the key, then loops on it: acquire, release, acquire at once.
other = ferrolock.LockManager([url], ttl=30, restart_guard=0)
held = other.acquire(key)
try:
    m.acquire(key, wait=0)
except ferrolock.NotAcquired:
    pass
held.release()
other.close()
m.acquire(key).release()
lock = m.acquire(key)
print("holding", flush=True)
while not os.path.exists(go):
    time.sleep(0.001)
for _ in range(50):
    lock.release()
    lock = m.acquire(key)
lock.release()
print("done", flush=True)
"""


def test_a_worker_loop_that_exits_tells_its_waiter_at_once(node: RedisNode, key: str, tmp_path: Path) -> None:
    """A worker in a loop releases quietly while the first waiter is within its barging bound
    (DESIGN.md, "Quiet streaks"); when its process exits right after the loop, exit tells that
    waiter, which would otherwise wait for its own re-check (here: seconds away)."""
    go = tmp_path / "go"
    child = Child(LOOPER, node.url, key, str(go))
    try:
        child.expect("holding")
        # The waiter re-checks on its own only every 5 s or more (retry_delay 10 s, jittered).
        waiter = ferrolock.LockManager([node.url], ttl=30, restart_guard=0, retry_delay=10.0)
        got: list[float] = []
        t = threading.Thread(target=lambda: (waiter.acquire(key).release(), got.append(time.monotonic())))
        t.start()
        r = node.client()
        q = f"ferrolock:queue:{{{key}}}"
        deadline = time.monotonic() + 10
        while r.zcard(q) != 1:
            assert time.monotonic() < deadline, "the waiter never queued"
            time.sleep(0.005)
        # Past its queued attempt and its re-check at the end of its bound (the lock is held).
        time.sleep(0.2)
        # For the test, the waiter stays within its barging bound for a minute: every release
        # of the loop may be quiet, however slow this machine is.
        (waiter_id,) = r.zrange(q, 0, -1)
        now_ms = int(r.time()[0]) * 1000 + int(r.time()[1]) // 1000
        r.zadd(f"ferrolock:queue-since:{{{key}}}", {waiter_id: now_ms + 60_000}, xx=True)
        go.touch()
        child.expect("done")
        assert child.wait(15) == 0, "".join(child.err)
        exited = time.monotonic()
        t.join(timeout=3)
        assert got, "the waiter was not told when the looping process exited"
        assert got[0] - exited < 3
        waiter.close()
    finally:
        child.kill()


def test_exit_releases_a_lost_lock_whose_token_still_stands(node: RedisNode, key: str) -> None:
    # The lock stays referenced by a daemon thread (never finalized), so only the exit hook
    # can release it.
    code = r"""
import sys, threading, time, ferrolock, redis
m = ferrolock.LockManager([sys.argv[1]], ttl=30)
ready = threading.Event()

def hold():
    lock = m.acquire(sys.argv[2], max_hold=0.5)   # lost after 0.5 s, its key kept for 30 s
    deadline = time.monotonic() + 10
    while not lock.lost and time.monotonic() < deadline:
        time.sleep(0.02)
    standing = redis.Redis.from_url(sys.argv[1]).get(sys.argv[2]) == lock.token.encode()
    print("lost, token standing" if lock.lost and standing else f"lost={lock.lost} standing={standing}", flush=True)
    ready.set()
    time.sleep(1000)

threading.Thread(target=hold, daemon=True).start()
ready.wait()
"""
    child = Child(code, node.url, key)
    try:
        child.expect("lost, token standing")
        assert child.wait(15) == 0, "".join(child.err)
        assert not node.client().exists(key), "exit left a lost lock's token until its ttl"
    finally:
        child.kill()


UNCAUGHT_SYNC = r"""
import os, sys, threading, time, ferrolock
url, key, go = sys.argv[1], sys.argv[2], sys.argv[3]
m = ferrolock.LockManager([url], ttl=30)
handle = m.acquire(key + ":handle")
box = {}
def in_with():
    # A block no exception passes through: only the exit hook can end it.
    with m.lock(key + ":thread") as lock:
        box["lock"] = lock
        time.sleep(1000)
threading.Thread(target=in_with, daemon=True).start()
while "lock" not in box:
    time.sleep(0.01)
with m.lock(key + ":with") as lock:
    print("holding", handle.token, box["lock"].token, lock.token, flush=True)
    while not os.path.exists(go):
        time.sleep(0.01)
    raise RuntimeError("caller bug")
"""

UNCAUGHT_ASYNC = r"""
import asyncio, os, sys, ferrolock
url, key, go = sys.argv[1], sys.argv[2], sys.argv[3]
m = ferrolock.LockManager([url], ttl=30)
# Referenced past main(), so the exit releases it rather than the garbage collector taking
# it with main()'s frame.
KEEP = []

async def sibling(entered):
    # Still inside its block when main() raises: asyncio.run cancels it on the way out.
    async with m.lock(key + ":task") as lock:
        entered.set_result(lock.token)
        await asyncio.sleep(1000)

async def main():
    kept = await m.acquire_async(key + ":handle")
    KEEP.append(kept)
    entered = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(sibling(entered))
    task_token = await entered
    async with m.lock(key + ":with") as lock:
        print("holding", kept.token, task_token, lock.token, flush=True)
        while not os.path.exists(go):
            await asyncio.sleep(0.01)
        raise RuntimeError("caller bug")

asyncio.run(main())
"""


@pytest.mark.parametrize("script", [UNCAUGHT_SYNC, UNCAUGHT_ASYNC], ids=["sync", "asyncio"])
def test_an_uncaught_exception_ending_the_process_releases_its_locks(
    node: RedisNode, key: str, tmp_path: Path, script: str
) -> None:
    # 30 s ttls: a key gone within the test was released, not expired.
    go = tmp_path / "go"
    child = Child(script, node.url, key, str(go))
    try:
        tokens = child.expect_prefix("holding").split()[1:]
        r = node.client()
        suffixes = [":handle", ":thread" if script is UNCAUGHT_SYNC else ":task", ":with"]
        # The fault's precondition: every lock is held by the child when it raises.
        assert [r.get(key + s) for s in suffixes] == tokens
        go.touch()
        assert child.wait(20) == 1, "".join(child.err)
        err = "".join(child.err)
        assert "Traceback" in err and "RuntimeError: caller bug" in err, err
        for s in suffixes:
            assert not r.exists(key + s), f"{s} was left to its ttl by the uncaught exception"
    finally:
        child.kill()


SUBINTERPRETER = r"""
import sys
try:
    import _interpreters as interpreters  # 3.13+
except ImportError:
    import _xxsubinterpreters as interpreters  # 3.11, 3.12
import ferrolock
url, key = sys.argv[1], sys.argv[2]
m = ferrolock.LockManager([url], ttl=30)
held = m.acquire(key + ":main")
sub = interpreters.create()
interpreters.run_string(sub, f'''
try:
    import ferrolock
except ImportError as e:
    print("refused:", e, flush=True)
else:
    m = ferrolock.LockManager([{url!r}], ttl=30)
    with m.lock({key!r} + ":sub"):
        pass
    print("used in the subinterpreter", flush=True)
''')
# The subinterpreter is left alive, as a program that embeds several may leave it.
print("main exits", flush=True)
"""


def test_a_subinterpreter_is_refused_and_the_process_still_exits(node: RedisNode, key: str) -> None:
    # The extension's state is per process (its runtime, its registries, the threads that
    # attach to "the" interpreter through the GIL-state API, which is the main one): a
    # subinterpreter that imported it got the main interpreter's objects and callbacks (a
    # `with` block's loss was raised into the main interpreter's code) and a process whose
    # subinterpreter was still alive at exit hung there for ever (found by a review). It is
    # refused at import, as PyO3 refuses a second interpreter; the main one goes on as before.
    pytest.importorskip("_xxsubinterpreters" if sys.version_info < (3, 13) else "_interpreters")
    child = Child(SUBINTERPRETER, node.url, key)
    try:
        child.expect("main exits")
        assert child.wait(30) == 0, "".join(child.err)
        out = child.out + child.rest()
        assert any(line.startswith("refused:") and "subinterpreter" in line for line in out), out
        assert "used in the subinterpreter" not in out
        assert "main exits" in out
        assert not node.client().exists(key + ":main"), "the main interpreter's lock was left to its ttl"
        assert not node.client().exists(key + ":sub")
    finally:
        child.kill()
