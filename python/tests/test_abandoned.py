"""A lock whose handle nobody can reach any more is released, so its ttl safety net holds:
an `async with` abandoned by a closed loop or a dropped task, a `with` entered and never
exited. The loss callbacks a block registers with the core must not keep the block (its task,
its context, its lock) alive from Rust, where Python's garbage collector cannot see them.

Bounds are 2 x ttl after `gc.collect()`: a safety-net deadline (the key would otherwise be
renewed forever), not a speed claim."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest

from ferrolock import LockManager

from conftest import RedisNode

TTL = 1.5  # the bound below is 2 x TTL; long enough for a loaded 2-core machine


def _loop_factories() -> list[Any]:
    factories: list[Any] = [pytest.param(asyncio.new_event_loop, id="asyncio")]
    try:
        import uvloop  # type: ignore[import-not-found, unused-ignore]  # not a dependency: only where installed
    except ImportError:
        factories.append(pytest.param(None, id="uvloop", marks=pytest.mark.skip("uvloop not installed")))
    else:
        factories.append(pytest.param(uvloop.new_event_loop, id="uvloop"))
    return factories


def _gone_within(node: RedisNode, key: str, bound: float) -> bool:
    r = node.client()
    deadline = time.monotonic() + bound
    while r.exists(key):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


async def _gone_within_async(node: RedisNode, key: str, bound: float) -> bool:
    r = node.client()
    deadline = time.monotonic() + bound
    while r.exists(key):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.05)
    return True


@pytest.mark.parametrize("reentrant", [False, True], ids=["plain", "reentrant"])
@pytest.mark.parametrize("new_loop", _loop_factories())
def test_async_with_in_a_task_of_a_closed_loop_is_released(
    node: RedisNode, key: str, new_loop: Callable[[], asyncio.AbstractEventLoop], reentrant: bool
) -> None:
    m = LockManager([node.url], ttl=TTL)
    try:

        async def body(entered: asyncio.Event) -> None:
            async with m.lock(key, reentrant=reentrant):
                entered.set()
                await asyncio.get_running_loop().create_future()  # never resolved

        loop = new_loop()
        try:

            async def start() -> asyncio.Task[None]:
                entered = asyncio.Event()
                task = asyncio.get_running_loop().create_task(body(entered))
                await entered.wait()
                return task

            task = loop.run_until_complete(start())
            assert not task.done()
        finally:
            loop.close()  # the task stays suspended inside the block
        assert node.client().exists(key)
        del task, loop
        gc.collect()
        assert _gone_within(node, key, 2 * TTL), "the abandoned block's lock is still renewed"
    finally:
        m.close()


@pytest.mark.parametrize("new_loop", _loop_factories())
def test_async_with_awaiting_wait_lost_in_a_task_of_a_closed_loop_is_released(
    node: RedisNode, key: str, new_loop: Callable[[], asyncio.AbstractEventLoop]
) -> None:
    # The body of an `interrupt=False` block hears of a loss through `wait_lost()`. The
    # library's thread that would hand its result to the loop held the loop's future, and so
    # the suspended task and its block: never collected, the lock was renewed for ever.
    m = LockManager([node.url], ttl=TTL)
    try:

        async def body(entered: asyncio.Event) -> None:
            async with m.lock(key, interrupt=False) as lock:
                entered.set()
                await lock.wait_lost()

        loop = new_loop()
        try:

            async def start() -> asyncio.Task[None]:
                entered = asyncio.Event()
                task = asyncio.get_running_loop().create_task(body(entered))
                await entered.wait()
                return task

            task = loop.run_until_complete(start())
            assert not task.done()
        finally:
            loop.close()
        assert node.client().exists(key)
        del task, loop
        gc.collect()
        assert _gone_within(node, key, 2 * TTL), "the abandoned block's lock is still renewed"
    finally:
        m.close()


@pytest.mark.parametrize("new_loop", _loop_factories())
def test_an_awaited_acquire_in_a_task_of_a_closed_loop_leaves_the_queue(
    node: RedisNode, key: str, new_loop: Callable[[], asyncio.AbstractEventLoop]
) -> None:
    # Nobody can take what it waits for: it kept its place in the server queue (its lease
    # renewed for ever), and was handed the lock when the holder let go.
    holder, m = LockManager([node.url], restart_guard=0), LockManager([node.url], restart_guard=0)
    r = node.client()
    queue, lease = f"ferrolock:queue:{{{key}}}", f"ferrolock:queue-lease:{{{key}}}"
    try:
        held = holder.acquire(key, ttl=30)
        loop = new_loop()
        try:

            async def start() -> asyncio.Task[Any]:
                task = asyncio.get_running_loop().create_task(m.acquire_async(key))
                deadline = time.monotonic() + 20
                while r.zcard(queue) == 0:
                    assert time.monotonic() < deadline, "the acquire never queued"
                    await asyncio.sleep(0.01)
                return task

            task = loop.run_until_complete(start())
            # The waiter's own deadline: its entry goes once its lease runs out, unless renewed.
            bound = 3 * r.pttl(lease) / 1000
            assert bound > 0, "no lease on the queue"
        finally:
            loop.close()
        del task, loop
        gc.collect()
        deadline = time.monotonic() + bound
        while r.zcard(queue):
            assert time.monotonic() < deadline, f"still in the queue {bound:.1f}s after its loop was collected"
            time.sleep(0.05)
        assert held.release()
    finally:
        holder.close()
        m.close()


@pytest.mark.parametrize("new_loop", _loop_factories())
def test_async_with_in_a_dropped_task_is_released(
    node: RedisNode, key: str, new_loop: Callable[[], asyncio.AbstractEventLoop]
) -> None:
    m = LockManager([node.url], ttl=TTL)

    async def body(entered: asyncio.Event) -> None:
        async with m.lock(key):
            entered.set()
            await asyncio.get_running_loop().create_future()  # nobody resolves it

    async def main() -> bool:
        entered = asyncio.Event()
        asyncio.get_running_loop().create_task(body(entered))  # fire and forget
        await entered.wait()
        assert node.client().exists(key)
        gc.collect()
        return await _gone_within_async(node, key, 2 * TTL)

    try:
        with asyncio.Runner(loop_factory=new_loop) as runner:
            gone = runner.run(main())
        assert gone, "the dropped task's lock is still renewed"
    finally:
        m.close()


def test_with_entered_and_never_exited_is_released(node: RedisNode, key: str) -> None:
    m = LockManager([node.url], ttl=TTL)
    try:
        stack = contextlib.ExitStack()  # dropped without close(): the block never exits
        lock = stack.enter_context(m.lock(key))
        assert node.client().get(key) == lock.token
        del stack, lock
        gc.collect()
        assert _gone_within(node, key, 2 * TTL), "the abandoned block's lock is still renewed"
    finally:
        m.close()


def _warned(caplog: pytest.LogCaptureFixture, key: str, bound: float) -> bool:
    # Records reach `logging` from a queue drained by a library thread, in order.
    words = f'lock "{key}" is released because its handle was garbage-collected while the lock was held'
    deadline = time.monotonic() + bound
    while not any(r.name == "ferrolock" and words in r.getMessage() for r in caplog.records):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_lock_whose_result_is_not_kept_is_released_with_a_warning(
    node: RedisNode, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    # CPython frees the result of `m.acquire(key)` on that line: the lock is released in the
    # background, and the warning says why (as Node's and Go's collectors do).
    caplog.set_level(logging.WARNING, logger="ferrolock")
    m = LockManager([node.url], ttl=30)
    try:
        m.acquire(key)
        assert _gone_within(node, key, 20), "the unkept lock was not released"
        assert _warned(caplog, key, 20), [r.getMessage() for r in caplog.records]
        # A handle released by hand, then dropped, warns nothing: a later warning (the log is
        # in order) comes alone.
        caplog.clear()
        lock = m.acquire(key + ":kept")
        assert lock.release()
        del lock
        m.acquire(key + ":marker")
        assert _warned(caplog, key + ":marker", 20)
        assert not _warned(caplog, key + ":kept", 0), [r.getMessage() for r in caplog.records]
    finally:
        m.close()


def test_an_async_with_of_a_closed_loop_is_released_without_the_collected_warning(
    node: RedisNode, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Its coroutine is closed with its task (asyncio logs "Task was destroyed but it is
    # pending!", naming it): nothing of the work it guarded runs on, so the warning for a lock
    # collected while held ("the work it guards may still be running") would be false.
    caplog.set_level(logging.WARNING, logger="ferrolock")
    m = LockManager([node.url], ttl=TTL)
    try:

        async def body(entered: asyncio.Event) -> None:
            async with m.lock(key):
                entered.set()
                await asyncio.get_running_loop().create_future()

        loop = asyncio.new_event_loop()
        try:

            async def start() -> asyncio.Task[None]:
                entered = asyncio.Event()
                task = asyncio.get_running_loop().create_task(body(entered))
                await entered.wait()
                return task

            task = loop.run_until_complete(start())
        finally:
            loop.close()
        del task, loop
        gc.collect()
        assert _gone_within(node, key, 2 * TTL), "the abandoned block's lock is still renewed"
        # A marker warned after it: the log is in order, so the block's warning would be in.
        m.acquire(key + ":marker")
        assert _warned(caplog, key + ":marker", 20)
        assert not _warned(caplog, key, 0), [r.getMessage() for r in caplog.records]
    finally:
        m.close()


def test_wait_lost_of_a_lock_collected_while_held_is_told_it_was_released(node: RedisNode, key: str) -> None:
    # Work still awaiting `wait_lost()` after its lock's last reference went is told, as for
    # any loss: the lock is released, and the work is no longer guarded.
    m = LockManager([node.url], ttl=30)
    try:

        async def main() -> str | None:
            lock = m.acquire(key)
            waiting = asyncio.ensure_future(lock.wait_lost())
            await asyncio.sleep(0)  # the wait has started
            del lock
            gc.collect()
            return await asyncio.wait_for(waiting, 20)

        reason = asyncio.run(main())
        assert reason is not None, "wait_lost() said the lock was released by its holder"
        assert f'lock "{key}" is released because its handle was garbage-collected while the lock was held' in reason
        assert _gone_within(node, key, 20), "the collected lock was not released"
    finally:
        m.close()


def test_records_dropped_while_a_logging_handler_blocks_are_counted(node: RedisNode, key: str) -> None:
    # The core's records wait in a bounded queue for a library thread to hand them to
    # `logging`. A handler that blocks fills it, and the records past it were dropped without
    # a word: the log looked complete. The next record handed over says how many.
    import threading

    in_handler = threading.Event()
    let_go = threading.Event()
    seen: list[str] = []

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())
            if not let_go.is_set():
                in_handler.set()
                let_go.wait(60)

    handler = Handler(level=logging.WARNING)
    logger = logging.getLogger("ferrolock")
    logger.addHandler(handler)
    m = LockManager([node.url], ttl=30)
    total = 1500
    try:
        m.acquire(f"{key}:0")  # not kept: released with a warning, held in the handler
        assert in_handler.wait(20), "the first warning never reached logging"
        for i in range(1, total):
            m.acquire(f"{key}:{i}")  # each warns as it is collected, while the handler blocks
        let_go.set()

        def accounted() -> int:
            warned = sum(f'lock "{key}:' in s for s in seen)
            dropped = sum(
                int(s.split(" log record")[0].rsplit(" ", 1)[-1]) for s in seen if "were dropped" in s
            )
            return warned + dropped

        deadline = time.monotonic() + 30
        while accounted() < total and time.monotonic() < deadline:
            time.sleep(0.05)
        warned = sum(f'lock "{key}:' in s for s in seen)
        assert warned < total, "the queue is bounded: some were dropped"
        assert accounted() == total, (
            f"{warned} of {total} warnings reached logging, and nothing said what became of the rest: "
            f"{[s for s in seen if key not in s]}"
        )
    finally:
        let_go.set()
        logger.removeHandler(handler)
        m.close()
