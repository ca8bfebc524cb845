"""The read-write lock from Python (issue 33): `manager.read_lock` / `write_lock` and the
one-call `read_lock(...)` / `write_lock(...)`, with and `async with`, on real servers."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import ferrolock
from ferrolock import LockManager

from conftest import RedisNode


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
