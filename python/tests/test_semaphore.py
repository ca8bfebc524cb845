"""The semaphore from Python (issue 33): `manager.semaphore(name, permits=N, count=K)` and the
one-call `ferrolock.semaphore(...)`, with `with` and `async with`, on real servers. The pool
is read from Redisson's layout: the counter `name` (permits free) and the zset
`{name}:timeout` (one id per permit taken)."""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import time

import pytest

import ferrolock
from ferrolock import LockManager

from conftest import Child, RedisNode
from test_fork import _in_child

TTL = 3.0  # long enough that a loaded 2-core machine does not flake


def free(node: RedisNode, name: str) -> int:
    return int(node.client().get(name))


def taken(node: RedisNode, name: str) -> int:
    return int(node.client().zcard(f"{{{name}}}:timeout"))


def test_holders_never_exceed_the_permits(node: RedisNode, manager: LockManager, key: str) -> None:
    """Six threads take one of 2 permits, five times each: at no instant do more than 2
    recorded holds overlap (each interval recorded inside the real hold)."""
    permits = 2
    intervals: list[tuple[float, float]] = []
    errors: list[BaseException] = []
    mutex = threading.Lock()

    def worker() -> None:
        try:
            for _ in range(5):
                with manager.semaphore(key, permits=permits, wait=120):
                    start = time.monotonic()
                    time.sleep(0.02)
                    end = time.monotonic()
                with mutex:
                    intervals.append((start, end))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(intervals) == 30
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1]))
    most = running = 0
    for _, step in events:
        running += step
        most = max(most, running)
    assert most <= permits, f"{most} holders at once with {permits} permits"
    assert free(node, key) == permits and taken(node, key) == 0


def test_permits_holders_hold_together_up_to_the_pool(node: RedisNode, manager: LockManager, key: str) -> None:
    with manager.semaphore(key, permits=2):
        with manager.semaphore(key, permits=2, wait=0) as second:
            assert second.key == key
            assert free(node, key) == 0 and taken(node, key) == 2
            with pytest.raises(ferrolock.NotAcquired):
                manager.semaphore(key, permits=2, wait=0).__enter__()
    assert free(node, key) == 2 and taken(node, key) == 0


def test_a_semaphore_inside_blocks_that_hold_its_pool_is_refused(node: RedisNode, manager: LockManager, key: str) -> None:
    # The thread's own blocks hold what the pool has: the nested block would wait for them,
    # which exit only after it (for ever without a wait), as `ferrolock run` refuses it.
    with manager.semaphore(key, permits=2):
        with manager.semaphore(key, permits=2):
            with pytest.raises(ferrolock.NotAcquired, match="would deadlock") as e:
                with manager.semaphore(key, permits=2, wait=20):
                    pytest.fail("granted beyond the pool")
            assert "2 of its 2 permits" in str(e.value) and e.value.key == key
        with pytest.raises(ferrolock.NotAcquired, match="would deadlock"):
            with ferrolock.semaphore(key, permits=2, count=2, wait=20, nodes=[node.url]):
                pytest.fail("granted beyond the pool")
        # What the blocks leave is granted, and another thread waits for the blocks as ever.
        with manager.semaphore(key, permits=2, wait=20):
            assert free(node, key) == 0
        outcome: list[object] = []

        def other() -> None:
            with manager.semaphore(key, permits=2, count=2, wait=60):
                outcome.append(taken(node, key))

        t = threading.Thread(target=other)
        t.start()
        time.sleep(0.2)
    t.join(timeout=60)
    assert outcome == [2]
    assert free(node, key) == 2 and taken(node, key) == 0

    # On the thread of an event loop whose `async with` blocks hold the pool, a blocking one;
    # inside a `with` block whose thread runs the loop, an awaited one.
    async def blocking() -> None:
        async with manager.semaphore(key, permits=2, count=2):
            with pytest.raises(ferrolock.NotAcquired, match="2 of its 2 permits.*would deadlock"):
                manager.semaphore(key, permits=2, wait=20).__enter__()

    asyncio.run(blocking())

    async def awaited() -> None:
        async with manager.semaphore(key, permits=2, wait=20):
            pytest.fail("granted beyond the pool")

    with manager.semaphore(key, permits=2, count=2):
        with pytest.raises(ferrolock.NotAcquired, match="2 of its 2 permits.*would deadlock"):
            asyncio.run(awaited())
    assert free(node, key) == 2 and taken(node, key) == 0


def test_a_semaphore_context_entered_twice_names_the_semaphore(manager: LockManager, key: str) -> None:
    # As every other semaphore error does; and a semaphore has no reentrant=True to suggest.
    ctx = manager.semaphore(key, permits=2, wait=0)

    async def enter_async() -> None:
        async with ctx:
            pass

    with ctx:
        for enter in (ctx.__enter__, lambda: asyncio.run(enter_async())):
            with pytest.raises(ferrolock.InvalidArgument) as e:
                enter()
            message = str(e.value)
            assert message.startswith(f'semaphore "{key}": this context is already entered'), message
            assert "manager.semaphore()" in message and "reentrant" not in message, message
            assert e.value.key == key


def test_a_count_above_one_takes_and_returns_that_many(node: RedisNode, manager: LockManager, key: str) -> None:
    with ferrolock.semaphore(key, permits=3, count=2, nodes=[node.url]):
        assert free(node, key) == 1 and taken(node, key) == 2
        with pytest.raises(ferrolock.NotAcquired):
            manager.semaphore(key, permits=3, count=2, wait=0).__enter__()
        with manager.semaphore(key, permits=3, wait=0):
            assert free(node, key) == 0
    assert free(node, key) == 3 and taken(node, key) == 0


def test_a_different_pool_size_is_refused_naming_both(node: RedisNode, manager: LockManager, key: str) -> None:
    with manager.semaphore(key, permits=3):
        with pytest.raises(ferrolock.InvalidArgument) as e:
            manager.semaphore(key, permits=5).__enter__()
    assert "has 3 permits, asked for 5" in str(e.value)
    assert e.value.key == key


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"permits": 0}, "count 1 of permits 0"),
        ({"permits": 2, "count": 3}, "count 3 of permits 2"),
        ({"permits": 2, "count": 0}, "count 0 of permits 2"),
        ({"permits": "3"}, "permits='3' (str)"),
        ({"permits": True}, "permits=True (bool)"),
        ({"permits": 2.0}, "permits=2.0 (float)"),
        ({"permits": -1}, "permits=-1 (int): must be at least 1"),
        ({"permits": 2**40}, f"permits={2**40} (int): too large"),
        ({"permits": 2, "count": "1"}, "count='1' (str)"),
        ({"permits": None}, "needs permits=N"),
    ],
)
def test_bad_permits_and_counts_are_refused_naming_the_value(
    manager: LockManager, key: str, kwargs: dict[str, object], words: str
) -> None:
    # Refused where the context is made, before any `with`.
    with pytest.raises(ferrolock.InvalidArgument) as e:
        manager.semaphore(key, **kwargs)  # type: ignore[arg-type]
    assert words in str(e.value) and isinstance(e.value, (ValueError, TypeError))
    assert str(e.value).startswith(f'semaphore "{key}"'), str(e.value)


def test_a_name_with_a_brace_and_several_nodes_are_refused(node: RedisNode, key: str) -> None:
    with LockManager([node.url]) as m:
        with pytest.raises(ferrolock.InvalidArgument) as e:
            m.semaphore(f"{key}{{x}}", permits=2).__enter__()
        assert f"{key}{{x}}" in str(e.value)
    # Never reached: a semaphore is refused before any node is asked.
    urls = [node.url, "redis://127.0.0.1:1", "redis://127.0.0.1:2"]
    with pytest.raises(ferrolock.InvalidArgument) as e:
        with ferrolock.semaphore(key, permits=2, nodes=urls):
            pass
    assert "3 nodes" in str(e.value) and "one node" in str(e.value)
    assert not node.client().exists(key)


@pytest.mark.parametrize(
    "options, words",
    [
        ({"ttl": -1}, "ttl=-1 (int): must not be negative"),
        ({"wait": "5"}, "wait='5' (str): expected a number of seconds"),
        ({"tll": 5}, 'unexpected option "tll"'),
    ],
)
def test_a_bad_option_names_the_semaphore(
    manager: LockManager, key: str, options: dict[str, object], words: str
) -> None:
    # Every other error of a semaphore names it so (its permits, its count, a closed
    # manager); its options' errors called it a lock.
    for make in (manager.semaphore, functools.partial(ferrolock.semaphore, nodes=manager.nodes)):
        with pytest.raises(ferrolock.InvalidArgument) as e:
            make(key, permits=2, **options)  # type: ignore[operator]
        assert str(e.value).startswith(f'semaphore "{key}": ') and words in str(e.value), str(e.value)
        assert e.value.key == key


def test_a_held_permits_extend_and_release_errors_name_the_semaphore(manager: LockManager, key: str) -> None:
    # Its acquire's errors say `semaphore "s"`; its extend's bad ttl and a second release said
    # `lock "s"`.
    with manager.semaphore(key, permits=2) as permit:
        with pytest.raises(ferrolock.InvalidArgument) as e:
            permit.extend(ttl=-1)
        assert str(e.value).startswith(f'semaphore "{key}": '), str(e.value)
    with pytest.raises(ferrolock.NotHeld) as released:
        permit.release()
    assert str(released.value) == f'semaphore "{key}" was already released', str(released.value)


def test_a_wait_ended_by_close_names_the_semaphore(manager: LockManager, node: RedisNode, key: str) -> None:
    # Its other errors say `semaphore "s"`; a wait that close() ended said `lock "s"`.
    holder = LockManager([node.url])
    with holder.semaphore(key, permits=1):
        m = LockManager([node.url])
        outcomes: list[BaseException] = []

        def wait() -> None:
            try:
                with m.semaphore(key, permits=1, wait=20):
                    pass
            except BaseException as e:  # noqa: BLE001 - the outcome is what the test checks
                outcomes.append(e)

        async def awaited() -> None:
            try:
                async with m.semaphore(key, permits=1, wait=20):
                    pass
            except BaseException as e:  # noqa: BLE001
                outcomes.append(e)

        threads = [threading.Thread(target=wait), threading.Thread(target=lambda: asyncio.run(awaited()))]
        for t in threads:
            t.start()
        time.sleep(0.5)
        m.close()
        for t in threads:
            t.join(20)
    holder.close()
    assert len(outcomes) == 2, outcomes
    for e in outcomes:
        assert isinstance(e, ferrolock.NotAcquired), repr(e)
        assert str(e).startswith(f'semaphore "{key}" not acquired: its manager was closed'), str(e)


@pytest.mark.parametrize(
    "name, words",
    [
        ("", "semaphore name must not be empty"),
        (b"encoders", "semaphore name must be a non-empty str, got b'encoders' (bytes)"),
        ("enc\ud800", "semaphore name 'enc\\ud800' is not valid Unicode"),
    ],
)
def test_a_bad_name_is_called_the_semaphores_name(manager: LockManager, name: object, words: str) -> None:
    # It said "lock key" (Node says "semaphore name").
    for make in (manager.semaphore, functools.partial(ferrolock.semaphore, nodes=manager.nodes)):
        with pytest.raises(ferrolock.InvalidArgument) as e:
            make(name, permits=2)  # type: ignore[operator]
        assert str(e.value).startswith(words), str(e.value)


def test_permits_and_count_belong_to_a_semaphore_only(manager: LockManager, key: str) -> None:
    with pytest.raises(ferrolock.InvalidArgument) as e:
        manager.lock(key, permits=2)
    assert "permits" in str(e.value)


def test_reentrant_true_asked_of_a_semaphore_is_refused_naming_it(node: RedisNode, manager: LockManager, key: str) -> None:
    # A semaphore never re-enters: a nested block asked with reentrant=True took a second
    # permit of the pool (or, with none left, raised NotAcquired), where the option promised
    # the owner would re-enter its own. Asked for it, it says so, as `ferrolock run` refuses
    # `--semaphore` with `--reentrant`.
    for make in (
        lambda: manager.semaphore(key, 2, reentrant=True),
        lambda: ferrolock.semaphore(key, 2, nodes=[node.url], reentrant=True),
    ):
        with pytest.raises(ferrolock.InvalidArgument) as e:
            make()
        assert e.value.key == key
        assert f'semaphore "{key}": reentrant=True' in str(e.value), str(e.value)
    # A manager's default is every lock's, a semaphore's included: that is not asking.
    m = LockManager([node.url], reentrant=True)
    with m.semaphore(key, 2):
        assert taken(node, key) == 1
        with m.semaphore(key, 2, reentrant=False):
            assert taken(node, key) == 2
    m.close()
    assert taken(node, key) == 0


def test_an_exception_in_the_body_returns_the_permits(node: RedisNode, manager: LockManager, key: str) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with manager.semaphore(key, permits=2, count=2):
            assert free(node, key) == 0
            raise RuntimeError("boom")
    assert free(node, key) == 2 and taken(node, key) == 0

    async def body() -> None:
        async with manager.semaphore(key, permits=2):
            assert taken(node, key) == 1
            raise RuntimeError("boom async")

    with pytest.raises(RuntimeError, match="boom async"):
        asyncio.run(body())
    assert free(node, key) == 2 and taken(node, key) == 0


HOLDER = r"""
import sys, ferrolock
with ferrolock.semaphore(sys.argv[2], permits=2, count=2, nodes=[sys.argv[1]], ttl=60):
    print("holding", flush=True)
    sys.exit(0)
"""


def test_process_exit_returns_the_permits(node: RedisNode, key: str, children: list[Child]) -> None:
    child = Child(HOLDER, node.url, key)
    children.append(child)
    child.expect("holding")
    # Taken while the child runs (a lease of 60 s: only the exit can give them back).
    assert child.wait(30) == 0, "".join(child.err)
    assert free(node, key) == 2 and taken(node, key) == 0


def test_a_cancelled_async_wait_leaves_no_permit_taken(node: RedisNode, manager: LockManager, key: str) -> None:
    async def main() -> None:
        holder = await manager.semaphore(key, permits=1).__aenter__()
        waiter = asyncio.ensure_future(manager.semaphore(key, permits=1).__aenter__())
        # Wait until the waiter has been refused at least once (it is waiting, not starting).
        for _ in range(600):
            await asyncio.sleep(0.05)
            if node.client().get(key) == "0" and not waiter.done():
                break
        assert not waiter.done()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert await holder.release_async()

    asyncio.run(main())
    assert free(node, key) == 1 and taken(node, key) == 0


def test_cancels_racing_grants_leave_no_permit_taken(node: RedisNode, manager: LockManager, key: str) -> None:
    """A cancel that lands while the grant is on its way back must give the permit back
    (issue 33: cancel leaves nothing taken). Needs the core's undo of a cancelled semaphore
    acquire."""

    async def main() -> None:
        for i in range(20):
            holder = await manager.semaphore(key, permits=1).__aenter__()
            waiter = asyncio.ensure_future(manager.semaphore(key, permits=1).__aenter__())
            await asyncio.sleep(0.01 * (i % 5))
            release = asyncio.ensure_future(holder.release_async())
            await asyncio.sleep(0.001 * i)
            waiter.cancel()
            await release
            try:
                got = await waiter
            except asyncio.CancelledError:
                continue
            assert await got.release_async()

    asyncio.run(main())
    assert free(node, key) == 1 and taken(node, key) == 0


def test_a_loss_callback_may_take_permits(node: RedisNode, key: str) -> None:
    m = LockManager([node.url], ttl=TTL, restart_guard=0)
    ctx = m.semaphore(key, permits=2, interrupt=False)
    lock = ctx.__enter__()
    seen: dict[str, object] = {}
    finished = threading.Event()

    def on_lost(_reason: str) -> None:
        try:
            with m.semaphore(key, permits=2, wait=60) as again:
                seen["taken"] = taken(node, key)
                seen["locked"] = again.locked()
        except BaseException as e:  # noqa: BLE001 - the test reports whatever it was
            seen["taken"] = e
        finished.set()

    lock._notify_lost(on_lost)
    # The holder's ids are gone and the pool is whole again: its next renewal finds it lost.
    pipe = node.client().pipeline(transaction=True)
    pipe.delete(f"{{{key}}}:timeout").set(key, 2).execute()
    assert finished.wait(60), "the loss was never signalled"
    assert seen == {"taken": 1, "locked": True}, seen
    with pytest.raises(ferrolock.LockLost):
        ctx.__exit__(None, None, None)
    assert free(node, key) == 2 and taken(node, key) == 0
    m.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_takes_permits_of_its_own_and_leaves_the_parents(node: RedisNode, key: str) -> None:
    m = LockManager([node.url], ttl=2)
    ctx = m.semaphore(key, permits=2, interrupt=False)
    held = ctx.__enter__()

    def child() -> None:
        assert not held.locked()
        with pytest.raises(ferrolock.NotHeld):
            held.release()
        with m.semaphore(key, permits=2, wait=5) as mine:
            assert mine.locked() and free(node, key) == 0 and taken(node, key) == 2
        with m.semaphore(key, permits=2, wait=5):  # its own permit came back: free again
            pass

    assert _in_child(child) == 0
    assert free(node, key) == 1 and taken(node, key) == 1
    time.sleep(2.5)  # longer than the lease: the parent's watchdog still renews its permit
    assert held.locked() and taken(node, key) == 1
    ctx.__exit__(None, None, None)
    assert free(node, key) == 2 and taken(node, key) == 0
    m.close()
