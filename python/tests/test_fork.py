"""A manager used after os.fork() works in the child; the parent's lock is not released,
renewed or re-entered by the child."""

from __future__ import annotations

import asyncio
import gc
import logging
import multiprocessing
import os
import sys
import threading
import time
import traceback

import pytest

import ferrolock
from ferrolock import LockManager

from conftest import Child, RedisNode

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _in_child(body: object) -> int:
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            body()  # type: ignore[operator]
            code = 0
        except BaseException:  # noqa: BLE001
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_manager_works_in_a_forked_child_and_leaves_the_parents_lock(node: RedisNode, key: str) -> None:
    m = LockManager([node.url], ttl=2)
    parent = m.acquire(key)  # renewed by the parent's watchdog every ~0.7 s
    token = parent.token

    def child() -> None:
        nonlocal parent
        assert not parent.locked()
        assert parent.validity == 0.0
        try:
            parent.release()
        except ferrolock.NotHeld as e:
            assert "forked child" in str(e)
        else:
            raise AssertionError("the child released its parent's lock")
        try:
            parent.extend()
        except ferrolock.NotHeld:
            pass
        else:
            raise AssertionError("the child extended its parent's lock")
        with pytest.raises(ferrolock.NotAcquired):
            m.acquire(key, wait=0)
        with m.lock(key + ":child", wait=5) as lock:  # the manager works: fresh runtime + connections
            assert lock.locked()
            assert node.client().get(key + ":child") == lock.token
        del parent
        gc.collect()  # dropping the inherited handle must not release the parent's lock
        time.sleep(0.2)

    assert _in_child(child) == 0
    assert node.client().get(key) == token
    time.sleep(2.5)  # longer than the ttl: the parent's watchdog still renews it
    assert node.client().get(key) == token
    assert parent.locked()
    assert parent.release() is True


def test_a_child_leaving_a_handles_with_block_leaves_the_parents_lock(node: RedisNode, key: str) -> None:
    # `with manager.acquire(key) as lock:` entered before a fork: the child that runs on out
    # of the block ends it as a scope whose lock was released elsewhere (nothing to release,
    # nothing raised); the parent's lock stays, and the parent's own exit releases it.
    m = LockManager([node.url], ttl=10)
    with m.acquire(key) as lock:
        token = lock.token

        def child() -> None:
            with lock:
                pass

        assert _in_child(child) == 0
        assert node.client().get(key) == token
        assert lock.locked()
    assert not node.client().exists(key)


def test_fork_inside_a_running_event_loop_leaves_the_parents_async_with(node: RedisNode, key: str) -> None:
    # A ttl of 4 s: a loaded machine's stall of a second does not lose it.
    m = LockManager([node.url], ttl=4)
    r = node.client()

    async def main() -> None:
        async with m.lock(key) as lock:  # renewed by the parent's watchdog every ~1.3 s
            token = lock.token

            def child() -> None:
                async def in_child() -> None:
                    with pytest.raises(ferrolock.NotHeld):
                        await lock.release_async()
                    with pytest.raises(ferrolock.NotAcquired):
                        await m.acquire_async(key, wait=0)
                    async with m.lock(key + ":child", wait=5) as mine:
                        assert node.client().get(key + ":child") == mine.token

                asyncio.run(in_child())  # the parent's loop is running only in the parent

            assert _in_child(child) == 0
            assert r.get(key) == token
            await asyncio.sleep(5)  # longer than the ttl: the parent still renews it
            assert r.get(key) == token
            assert lock.locked()
        assert not r.exists(key)
        assert not r.exists(key + ":child")

    asyncio.run(main())
    m.close()


FORK_WHILE_WAITING = r"""
import os, sys, threading, time, traceback, redis, ferrolock
url, key = sys.argv[1], sys.argv[2]
r = redis.Redis.from_url(url, decode_responses=True)
q = "ferrolock:queue:{%s}" % key
m = ferrolock.LockManager([url], ttl=10)
held = m.acquire(key)
got = []
t = threading.Thread(target=lambda: got.append(m.acquire(key, wait=120)))
t.start()
deadline = time.monotonic() + 30
while r.zcard(q) < 1:
    assert time.monotonic() < deadline, "the waiter never queued"
    time.sleep(0.01)
line = r.zrange(q, 0, -1)
pid = os.fork()
if pid == 0:
    code = 1
    try:
        try:
            m.acquire(key, wait=0)
        except ferrolock.NotAcquired:
            pass
        else:
            raise AssertionError("the child took its parent's key")
        with m.lock(key + ":child", wait=5) as lock:
            assert r.get(key + ":child") == lock.token
        m.close()  # would end the inherited wait, were there one
        code = 0
    except BaseException:
        traceback.print_exc()
    # A normal exit: the child's exit hook runs (its own waits end, its locks are released).
    sys.exit(code)
_, status = os.waitpid(pid, 0)
print("child exit", os.waitstatus_to_exitcode(status), flush=True)
print("line kept", r.zrange(q, 0, -1) == line, flush=True)
print("key kept", r.get(key) == held.token, flush=True)
held.release()
t.join(60)
print("waiter got it", bool(got) and r.get(key) == got[0].token, flush=True)
got[0].release()
"""


def test_fork_while_a_thread_waits_for_a_lock(node: RedisNode, key: str) -> None:
    # The fork copies the manager mid-wait; the child has no waiting thread, must not wait or
    # give up the parent's place in line (not even when its close() and exit end its waits),
    # and the parent's waiter is still granted once the key is released.
    child = Child(FORK_WHILE_WAITING, node.url, key)
    try:
        for expected in ("child exit 0", "line kept True", "key kept True", "waiter got it True"):
            child.expect(expected, timeout=90)
        assert child.wait(30) == 0, "".join(child.err)
        r = node.client()
        assert not r.exists(key) and not r.exists(key + ":child")
        assert r.zcard(f"ferrolock:queue:{{{key}}}") == 0
    finally:
        child.kill()


def _count(args: tuple[str, str, int]) -> int:
    url, key, n = args
    import redis

    r = redis.Redis.from_url(url)
    for _ in range(n):
        with ferrolock.redlock(key, nodes=[url]):
            v = int(r.get(key + ":n") or 0)
            time.sleep(0.001)
            r.set(key + ":n", v + 1)
    return n


def test_multiprocessing_fork_pool_with_shared_redlock_manager(node: RedisNode, key: str) -> None:
    with ferrolock.redlock(key, nodes=[node.url]):  # the shared manager exists before the fork
        pass
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(3) as pool:
        done = pool.map(_count, [(node.url, key, 20)] * 3)
    assert sum(done) == 60
    assert int(node.client().get(key + ":n")) == 60


def test_a_child_forked_while_the_parent_hands_a_record_to_logging_still_logs(
    node: RedisNode, key: str
) -> None:
    # The core's records reach `logging` from one drain at a time, run on a library thread.
    # A child forked while the parent's drain ran (its thread not copied) saw a drain that
    # never ended and never scheduled one of its own: every record it made was dropped; and
    # its exit waited 2 s for that drain's thread (found by a review). The parent's drain is
    # held in a handler across the fork.
    parent_pid = os.getpid()
    in_handler = threading.Event()
    let_go = threading.Event()
    seen: list[str] = []

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())
            if os.getpid() == parent_pid and not let_go.is_set():
                in_handler.set()
                let_go.wait(30)

    handler = Handler(level=logging.WARNING)
    logger = logging.getLogger("ferrolock")
    logger.addHandler(handler)
    m = LockManager([node.url], ttl=30)
    try:
        m.acquire(key + ":parent")  # not kept: released with a warning
        assert in_handler.wait(20), "the parent's warning never reached logging"

        # The drain is counted as a thread in Python, which the exit waits for (2 s at most).
        assert ferrolock._ferrolock._background_calls_for_test() >= 1

        def child() -> None:
            # That thread was not copied: the child's exit must not wait for it.
            assert ferrolock._ferrolock._background_calls_for_test() == 0
            seen.clear()
            m.acquire(key + ":child")  # not kept either
            deadline = time.monotonic() + 20
            while not any(key + ":child" in s for s in seen):
                assert time.monotonic() < deadline, f"the child's warning never reached logging: {seen}"
                time.sleep(0.05)

        assert _in_child(child) == 0
    finally:
        let_go.set()
        logger.removeHandler(handler)
        m.close()


def test_a_library_thread_keeps_its_python_thread_state_between_calls(node: RedisNode, key: str) -> None:
    # A library thread (the blocking pool's: asyncio results, loss callbacks, log records)
    # came into Python with a thread state made for that one call and deleted after it, each
    # under CPython's thread-list lock, taken without the GIL. CPython 3.11's os.fork() takes
    # that lock in the child before resetting it: a fork while a library thread held it hung
    # the child for ever inside os.fork() (found by a review: about one fork in 600 beside two
    # tasks acquiring in a loop). Now a library thread keeps its thread state until it ends.
    # Seen from Python: a threading.local() set on such a thread is still there at its next
    # call (a new thread state starts with none). The records come one at a time, so a thread
    # of the pool takes more than one.
    local = threading.local()
    seen: list[tuple[int, int]] = []

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if key in record.getMessage():
                local.calls = getattr(local, "calls", 0) + 1
                seen.append((threading.get_ident(), local.calls))

    handler = Handler(level=logging.WARNING)
    logger = logging.getLogger("ferrolock")
    logger.addHandler(handler)
    m = LockManager([node.url], ttl=30)
    try:
        for i in range(8):
            m.acquire(f"{key}:{i}")  # not kept: released with a warning, on a library thread
            deadline = time.monotonic() + 20
            while len(seen) <= i:
                assert time.monotonic() < deadline, f"warning {i} never reached logging: {seen}"
                time.sleep(0.01)
        threads = [ident for ident, _ in seen]
        again = [ident for ident in set(threads) if threads.count(ident) > 1]
        assert again, f"no library thread handled two records: {seen}"
        for ident in again:
            calls = [n for t, n in seen if t == ident]
            assert calls == list(range(1, len(calls) + 1)), (
                f"thread {ident} came back with a new thread state each time: {seen}"
            )
    finally:
        logger.removeHandler(handler)
        m.close()


_KEPT: list[object] = []


def _hold_and_return(url: str, key: str) -> None:
    # A multiprocessing child whose work ends with a lock still held: one kept referenced
    # (a global) and one held by a non-daemon thread that still works after the target returned
    # (it must still be able to acquire: the process has not begun its exit yet).
    m = LockManager([url], ttl=60)
    _KEPT.append(m.acquire(key + ":kept"))
    started = threading.Event()

    def late() -> None:
        started.set()
        time.sleep(0.5)
        _KEPT.append(m.acquire(key + ":late", wait=10))

    threading.Thread(target=late).start()
    started.wait(10)


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_a_multiprocessing_child_releases_what_it_still_holds_when_it_ends(
    node: RedisNode, key: str, method: str
) -> None:
    # A fork or forkserver child of multiprocessing ends through os._exit after its target,
    # which skips `atexit`: its locks were left for their ttl (60 s here), while a spawn child,
    # a whole interpreter, released them. Every start method now runs ferrolock's exit.
    ctx = multiprocessing.get_context(method)
    p = ctx.Process(target=_hold_and_return, args=(node.url, key))
    p.start()
    p.join(120)
    assert p.exitcode == 0
    r = node.client()
    assert not r.exists(key + ":kept"), f"the {method} child's lock is still held after it ended"
    assert not r.exists(key + ":late"), f"the {method} child's thread's lock is still held after it ended"


def _hold_with_an_executor_left_open(url: str, key: str) -> None:
    # A child whose work leaves a ThreadPoolExecutor open (as many libraries do): its worker
    # threads are non-daemon and end only when threading's own exit tells them to.
    from concurrent.futures import ThreadPoolExecutor

    executor = ThreadPoolExecutor(2)
    _KEPT.append(executor)
    m = LockManager([url], ttl=60)
    _KEPT.append(executor.submit(m.acquire, key).result(10))


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_a_multiprocessing_child_with_an_open_thread_pool_still_ends(
    node: RedisNode, key: str, method: str
) -> None:
    # ferrolock's exit for such a child joined its non-daemon threads before threading's exit
    # callbacks ran (they run first at interpreter exit): an executor's workers, never told to
    # stop, were waited for ever, and the child never ended.
    ctx = multiprocessing.get_context(method)
    p = ctx.Process(target=_hold_with_an_executor_left_open, args=(node.url, key))
    p.start()
    p.join(60)
    hung = p.is_alive()
    if hung:
        p.kill()
        p.join(10)
    assert not hung, f"the {method} child never ended"
    assert p.exitcode == 0
    assert not node.client().exists(key), f"the {method} child's lock is still held after it ended"
