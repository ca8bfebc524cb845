"""The read-write lock from Python (issue 33): `manager.read_lock` / `write_lock` and the
one-call `read_lock(...)` / `write_lock(...)`, with and `async with`, on real servers."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import ferrolock
from ferrolock import LockManager

from conftest import Child, RedisNode
from test_fork import _in_child


@contextmanager
def held_in_thread(ctx: ferrolock.LockContext) -> Iterator[None]:
    """Holds `ctx` in another thread (another owner) for the duration of the block."""
    entered, leave = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with ctx:
                entered.set()
                leave.wait()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            entered.set()

    t = threading.Thread(target=run)
    t.start()
    entered.wait()
    try:
        assert not errors, errors
        yield
    finally:
        leave.set()
        t.join()
    assert not errors, errors


def test_two_readers_hold_at_once(node: RedisNode, manager: LockManager, key: str) -> None:
    with held_in_thread(manager.read_lock(key)):
        with manager.read_lock(key, wait=0) as lock:
            assert lock.key == key
            assert node.client().hget(key, "mode") == "read"
    assert not node.client().exists(key)


def test_a_writer_excludes_readers_and_writers(node: RedisNode, manager: LockManager, key: str) -> None:
    with held_in_thread(manager.write_lock(key)):
        assert node.client().hget(key, "mode") == "write"
        with pytest.raises(ferrolock.NotAcquired):
            manager.read_lock(key, wait=0).__enter__()
        with pytest.raises(ferrolock.NotAcquired):
            manager.write_lock(key, wait=0).__enter__()
        with pytest.raises(ferrolock.NotAcquired):
            manager.lock(key, wait=0).__enter__()
    # A reader excludes a writer too.
    with held_in_thread(manager.read_lock(key)):
        with pytest.raises(ferrolock.NotAcquired):
            manager.write_lock(key, wait=0).__enter__()
    with manager.write_lock(key, wait=0):
        pass
    assert not node.client().exists(key)


def test_downgrade_works_and_upgrade_is_refused(node: RedisNode, manager: LockManager, key: str) -> None:
    # The owner is the thread: a read under its own write lock is a downgrade.
    with manager.write_lock(key):
        with manager.read_lock(key, wait=0):
            assert node.client().hget(key, "mode") == "write"
    assert not node.client().exists(key)
    with manager.read_lock(key):
        with pytest.raises(ferrolock.InvalidArgument, match="read->write upgrade is refused") as err:
            manager.write_lock(key, wait=0).__enter__()
        assert key in str(err.value)
    assert not node.client().exists(key)


OUTER_INNER = [("lock", "semaphore"), ("lock", "read"), ("lock", "write"), ("read", "lock"), ("write", "lock")]


def _context(manager: LockManager, kind: str, key: str, **options: object) -> ferrolock.LockContext:
    if kind == "semaphore":
        return manager.semaphore(key, permits=2, **options)  # type: ignore[arg-type]
    return {"lock": manager.lock, "read": manager.read_lock, "write": manager.write_lock}[kind](key, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize("outer, inner", OUTER_INNER)
def test_a_block_of_another_kind_holding_the_name_refuses_at_once(
    node: RedisNode, manager: LockManager, key: str, outer: str, inner: str
) -> None:
    # Inside a block that holds the name as one kind, another kind of it (a semaphore or a
    # read-write lock beside a lock, a lock beside a read-write hold) could only wait for that
    # block: for ever with no wait. Refused at once, as a nested lock of the key is (and as
    # Node refuses it); the wait below only bounds the test.
    with _context(manager, outer, key):
        started = time.monotonic()
        with pytest.raises(ferrolock.NotAcquired) as e:
            _context(manager, inner, key, wait=3).__enter__()
        assert time.monotonic() - started < 1.5, str(e.value)
        word = {"lock": "lock", "read": "read lock", "write": "write lock"}[outer]
        assert f"inside a `with` block that holds it as a {word}" in str(e.value), str(e.value)
        assert "would deadlock" in str(e.value) and e.value.key == key
    assert not node.client().exists(key)

    # On the thread of an event loop whose `async with` holds the name, a blocking acquire
    # of another kind, and inside a `with` block whose thread runs the loop, an awaited one.
    async def main() -> None:
        async with _context(manager, outer, key):
            with pytest.raises(ferrolock.NotAcquired, match="would deadlock|could never release"):
                _context(manager, inner, key, wait=3).__enter__()

    asyncio.run(main())

    async def awaited() -> None:
        async with _context(manager, inner, key, wait=3):
            pass

    with _context(manager, outer, key):
        with pytest.raises(ferrolock.NotAcquired, match="would deadlock"):
            asyncio.run(awaited())


def test_read_ttl_above_30s_is_refused(manager: LockManager, key: str) -> None:
    with pytest.raises(ferrolock.InvalidArgument, match="31s"):
        manager.read_lock(key, ttl=31).__enter__()
    # A writer may hold longer.
    with manager.write_lock(key, ttl=31):
        pass


def test_fencing_is_for_writers_only(manager: LockManager, key: str) -> None:
    with pytest.raises(ferrolock.InvalidArgument, match="fenc"):
        manager.read_lock(key, fencing=True).__enter__()
    fences = []
    for _ in range(3):
        with manager.write_lock(key, fencing=True) as lock:
            fences.append(lock.fence)
    assert all(f is not None for f in fences)
    assert fences == sorted(fences) and len(set(fences)) == 3, fences


def test_fencing_asked_of_a_reader_is_refused_where_the_context_is_made(node: RedisNode, manager: LockManager, key: str) -> None:
    # As a read ttl above 30 s is, and a semaphore's fencing: a context made at import time
    # (or in a constructor) is refused there, not at some later `with` in the middle of the work.
    fenced = LockManager([node.url], fencing=True)
    for make in (
        lambda: manager.read_lock(key, fencing=True),
        lambda: ferrolock.read_lock(key, nodes=[node.url], fencing=True),
        lambda: fenced.read_lock(key),
    ):
        with pytest.raises(ferrolock.InvalidArgument) as e:
            make()
        assert e.value.key == key and "fence tokens go to writers only" in str(e.value), str(e.value)
    fenced.write_lock(key)
    fenced.close()


def test_async_with_both_sides(node: RedisNode, manager: LockManager, key: str) -> None:
    async def main() -> None:
        async with manager.read_lock(key) as a:
            # Another task is another owner: it shares the read side.
            async def second() -> None:
                async with manager.read_lock(key, wait=0):
                    assert node.client().hget(key, "mode") == "read"

            await asyncio.create_task(second())
            assert not a.lost
        async with manager.write_lock(key) as w:
            assert node.client().hget(key, "mode") == "write"

            async def refused() -> None:
                async with manager.read_lock(key, wait=0):
                    pass

            with pytest.raises(ferrolock.NotAcquired):
                await asyncio.create_task(refused())
            assert not w.lost
        assert not node.client().exists(key)

    asyncio.run(main())


def test_cancelled_async_read_acquire_leaves_nothing(node: RedisNode, manager: LockManager, key: str) -> None:
    async def main() -> None:
        writer = await manager.write_lock(key).__aenter__()
        ctx = manager.read_lock(key)
        waiter = asyncio.create_task(ctx.__aenter__())
        await asyncio.sleep(0.3)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert await writer.release_async() is True
        await asyncio.sleep(0.5)
        # The cancelled reader must not have taken the key after the release.
        assert not node.client().exists(key)
        assert not node.client().keys(f"*{key}*rwlock_timeout*")

    asyncio.run(main())


def test_one_call_helpers(node: RedisNode, key: str) -> None:
    with held_in_thread(ferrolock.read_lock(key, nodes=[node.url])):
        assert node.client().hget(key, "mode") == "read"
        # Another owner (this thread) is not granted the write side beside that reader.
        with pytest.raises(ferrolock.NotAcquired):
            ferrolock.write_lock(key, nodes=[node.url], wait=0).__enter__()
    with ferrolock.write_lock(key, nodes=[node.url], wait=0):
        assert node.client().hget(key, "mode") == "write"
    assert not node.client().exists(key)


def test_bad_input_is_named(manager: LockManager) -> None:
    with pytest.raises(ferrolock.InvalidArgument, match="must not be empty"):
        manager.read_lock("")
    with pytest.raises(ferrolock.InvalidArgument, match="42"):
        manager.write_lock(42)  # type: ignore[arg-type]
    with pytest.raises(ferrolock.InvalidArgument, match="'soon'"):
        manager.read_lock("k", ttl="soon")


@pytest.mark.parametrize("side", ["read", "write"])
def test_a_deleted_hold_is_lost_and_the_exit_raises_lock_lost(node: RedisNode, manager: LockManager, key: str, side: str) -> None:
    """The watchdog renews each side like a lock; a hold taken away (its keys deleted) is
    reported through `lock.lost` and the `with` exit raises `LockLost` naming the key."""
    ttl = 2.0
    ctx = manager.read_lock(key, ttl=ttl, interrupt=False) if side == "read" else manager.write_lock(key, ttl=ttl, interrupt=False)
    with pytest.raises(ferrolock.LockLost) as info:
        with ctx as lock:
            assert not lock.lost
            r = node.client()
            r.delete(key, *r.keys(f"{key}*"), *r.keys(f"{{{key}}}*"))
            # The next renewal (every ttl/3) finds the hold gone; the bound is generous.
            deadline = time.monotonic() + 10 * ttl
            while not lock.lost and time.monotonic() < deadline:
                time.sleep(0.02)
            assert lock.lost
    assert info.value.key == key


# Lifetimes: the same as the lock's (an exception in the body, process exit, fork, a call from
# inside a loss callback), shown for the read-write lock itself.


@pytest.mark.parametrize("side", ["read", "write"])
def test_an_exception_in_the_body_releases_the_hold(node: RedisNode, manager: LockManager, key: str, side: str) -> None:
    take = manager.read_lock if side == "read" else manager.write_lock
    with pytest.raises(RuntimeError, match="boom"):
        with take(key):
            assert node.client().hget(key, "mode") == side
            raise RuntimeError("boom")
    assert not node.client().exists(key)

    async def body() -> None:
        async with take(key):
            assert node.client().hget(key, "mode") == side
            raise RuntimeError("boom async")

    with pytest.raises(RuntimeError, match="boom async"):
        asyncio.run(body())
    assert not node.client().exists(key)


RW_HOLDER = r"""
import sys, ferrolock
take = ferrolock.read_lock if sys.argv[3] == "read" else ferrolock.write_lock
with take(sys.argv[2], nodes=[sys.argv[1]], ttl=25):
    print("holding", flush=True)
    sys.exit(0)
"""


@pytest.mark.parametrize("side", ["read", "write"])
def test_process_exit_releases_the_hold(node: RedisNode, key: str, side: str, children: list[Child]) -> None:
    child = Child(RW_HOLDER, node.url, key, side)
    children.append(child)
    child.expect("holding")
    # A lease of 25 s: only the exit's release can have removed the hold by the time it ends.
    assert child.wait(20) == 0, "".join(child.err)
    r = node.client()
    assert not r.exists(key) and not r.keys(f"{{{key}}}*"), r.keys("*")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_reads_beside_the_parent_and_leaves_its_hold(node: RedisNode, key: str) -> None:
    m = LockManager([node.url], ttl=2)
    parent = m.read_lock(key, interrupt=False)
    held = parent.__enter__()

    def child() -> None:
        assert not held.locked()
        with pytest.raises(ferrolock.NotHeld):
            held.release()
        with m.read_lock(key, wait=5) as mine:  # a reader of its own, beside the parent's
            assert mine.locked() and len(node.client().hgetall(key)) == 3  # mode + 2 readers
        with pytest.raises(ferrolock.NotAcquired):
            m.write_lock(key, wait=0).__enter__()

    assert _in_child(child) == 0
    fields = node.client().hgetall(key)
    assert fields.get("mode") == "read" and len(fields) == 2, fields
    time.sleep(2.5)  # longer than the ttl: the parent's watchdog still renews its hold
    assert held.locked() and node.client().hget(key, "mode") == "read"
    parent.__exit__(None, None, None)
    assert not node.client().exists(key)
    m.close()


def test_a_loss_callback_may_take_the_write_lock(node: RedisNode, key: str) -> None:
    m = LockManager([node.url], ttl=2, restart_guard=0)
    ctx = m.read_lock(key, interrupt=False)
    lock = ctx.__enter__()
    seen: dict[str, object] = {}
    finished = threading.Event()

    def on_lost(_reason: str) -> None:
        try:
            with m.write_lock(key, wait=60) as again:
                seen["mode"] = node.client().hget(key, "mode")
                seen["locked"] = again.locked()
        except BaseException as e:  # noqa: BLE001 - the test reports whatever it was
            seen["mode"] = e
        finished.set()

    lock._notify_lost(on_lost)
    r = node.client()
    r.delete(key, *r.keys(f"{{{key}}}*"))  # the hold taken away: the next renewal finds it lost
    assert finished.wait(60), "the loss was never signalled"
    assert seen == {"mode": "write", "locked": True}, seen
    with pytest.raises(ferrolock.LockLost):
        ctx.__exit__(None, None, None)
    assert not r.exists(key)
    m.close()
