"""Mutual exclusion with a non-atomic read-modify-write: across processes, threads sharing
one manager, and asyncio tasks; and the GIL is released while waiting."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

import ferrolock
from ferrolock import LockManager

from conftest import Child, RedisNode

WORKER = r"""
import sys, time, redis, ferrolock
url, key, counter, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
r = redis.Redis.from_url(url)
m = ferrolock.LockManager([url], ttl=5)
print("ready", flush=True)
for _ in range(n):
    with m.lock(key):
        v = int(r.get(counter) or 0)   # read ...
        time.sleep(0.001)              # ... let others run ...
        r.set(counter, v + 1)          # ... write: lost updates unless excluded
print("done", flush=True)
"""


def test_exclusion_across_processes(node: RedisNode, key: str) -> None:
    import subprocess
    import sys

    counter = key + ":counter"
    procs = [
        subprocess.Popen([sys.executable, "-c", WORKER, node.url, key, counter, "40"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert "done" in out
    assert int(node.client().get(counter)) == 160
    assert not node.client().exists(key)


def test_threads_share_one_manager(manager: LockManager, key: str) -> None:
    state = {"n": 0, "inside": 0, "max_inside": 0}
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(40):
                with manager.lock(key, ttl=5):
                    state["inside"] += 1
                    state["max_inside"] = max(state["max_inside"], state["inside"])
                    v = state["n"]
                    time.sleep(0.0005)
                    state["n"] = v + 1
                    state["inside"] -= 1
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert state["n"] == 240
    assert state["max_inside"] == 1


def test_blocking_wait_releases_the_gil(manager: LockManager, key: str) -> None:
    held = manager.acquire(key)
    ticks = 0
    stop = threading.Event()

    def spin() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1

    t = threading.Thread(target=spin)
    t.start()
    time.sleep(0.05)
    before = ticks
    with pytest.raises(ferrolock.NotAcquired):
        manager.acquire(key, wait=0.5)
    during = ticks - before
    stop.set()
    t.join()
    held.release()
    # A Python thread keeps running while this one waits in Rust: hundreds of thousands of
    # ticks; with the GIL held it would get (almost) none.
    assert during > 10_000, during


def test_async_with_across_tasks(node: RedisNode, key: str) -> None:
    async def main() -> None:
        m = LockManager([node.url], ttl=5)
        state = {"n": 0, "inside": 0, "max_inside": 0}

        async def work() -> None:
            for _ in range(15):
                async with m.lock(key):
                    state["inside"] += 1
                    state["max_inside"] = max(state["max_inside"], state["inside"])
                    v = state["n"]
                    await asyncio.sleep(0.001)
                    state["n"] = v + 1
                    state["inside"] -= 1

        await asyncio.wait_for(asyncio.gather(*(work() for _ in range(8))), 120)
        assert state["n"] == 120
        assert state["max_inside"] == 1
        assert not node.client().exists(key)
        await m.__aexit__()

    asyncio.run(main())


def test_async_and_sync_redlock_share_the_key(node: RedisNode, key: str) -> None:
    async def main() -> None:
        async with ferrolock.redlock(key, nodes=[node.url]) as lock:
            assert node.client().get(key) == lock.token
            with pytest.raises(ferrolock.NotAcquired):
                await ferrolock.LockManager([node.url]).acquire_async(key, wait=0)
        assert not node.client().exists(key)

    asyncio.run(main())


def test_event_loop_keeps_running_while_a_task_waits(manager: LockManager, key: str) -> None:
    async def main() -> None:
        held = await manager.acquire_async(key)
        ticks = 0

        # Only a loop that runs while the acquire waits lets the ticker tick and then release
        # the lock the acquire waits for (a count of ticks in a fixed time would measure the
        # machine instead).
        async def ticker() -> None:
            nonlocal ticks
            while ticks < 5:
                ticks += 1
                await asyncio.sleep(0.01)
            assert await held.release_async() is True

        t = asyncio.create_task(ticker())
        lock = await manager.acquire_async(key, wait=30)
        assert ticks == 5, ticks
        await t
        assert await lock.release_async() is True

    asyncio.run(main())


def test_cancelled_async_acquire_leaves_nothing(node: RedisNode, manager: LockManager, key: str) -> None:
    async def main() -> None:
        held = await manager.acquire_async(key)
        waiter = asyncio.create_task(manager.acquire_async(key))
        await asyncio.sleep(0.3)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert await held.release_async() is True
        await asyncio.sleep(0.5)
        # The cancelled waiter must not have taken the key after the release.
        assert not node.client().exists(key)

    asyncio.run(main())


def test_a_locks_async_methods_may_be_called_before_their_loop_runs(
    node: RedisNode, manager: LockManager, key: str
) -> None:
    # They return coroutines (the stubs say so), which asyncio.run() and run_until_complete()
    # take: made outside a running loop, they raised "RuntimeError: no running event loop".
    lock = manager.acquire(key)
    assert asyncio.run(lock.extend_async(5)) > 4
    assert node.client().pttl(key) > 4000
    loop = asyncio.new_event_loop()
    try:
        lost = lock.wait_lost()
        released = lock.release_async()
        assert loop.run_until_complete(released) is True
        assert loop.run_until_complete(lost) is None
    finally:
        loop.close()
    assert not node.client().exists(key)


def test_cancelled_async_release_still_completes(node: RedisNode, manager: LockManager, key: str) -> None:
    """redis-py #3847: a cancelled async release leaked the lock until its ttl.

    The release starts when `release_async()` is called; its await is cancelled either before
    the task first runs (always raises CancelledError) or after one loop turn (the release may
    already have finished, then nothing is cancelled). Either way the key must go well before
    its ttl, which is the bound here (not a speed)."""
    ttl = 30.0

    async def gone_before_ttl(acquired_at: float) -> None:
        while node.client().exists(key) and time.monotonic() < acquired_at + ttl / 2:
            await asyncio.sleep(0.01)
        assert not node.client().exists(key)

    async def main() -> None:
        for _ in range(5):
            lock = await manager.acquire_async(key, ttl=ttl)
            acquired_at = time.monotonic()
            assert node.client().exists(key)
            task = asyncio.create_task(lock.release_async())
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await gone_before_ttl(acquired_at)
        for _ in range(5):
            lock = await manager.acquire_async(key, ttl=ttl)
            acquired_at = time.monotonic()
            task = asyncio.create_task(lock.release_async())
            await asyncio.sleep(0)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            await gone_before_ttl(acquired_at)

    asyncio.run(main())


def test_cancelled_async_with_exit_still_releases(node: RedisNode, manager: LockManager, key: str) -> None:
    async def main() -> None:
        started = asyncio.Event()

        async def body() -> None:
            async with manager.lock(key, ttl=30):
                started.set()
                await asyncio.sleep(30)

        task = asyncio.create_task(body())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        deadline = time.monotonic() + 2
        while node.client().exists(key) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert not node.client().exists(key)

    asyncio.run(main())


def test_an_exception_in_an_async_with_body_releases_and_goes_through(
    node: RedisNode, manager: LockManager, key: str
) -> None:
    class BodyError(Exception):
        pass

    raised = BodyError("the body's own")

    async def main() -> None:
        r = node.client()
        with pytest.raises(BodyError) as info:
            async with manager.lock(key, ttl=30) as lock:
                assert r.get(key) == lock.token
                await asyncio.sleep(0)
                raise raised
        assert info.value is raised
        # The exit awaited the release: gone now, not at the end of the 30 s ttl.
        assert not r.exists(key)
        assert not lock.locked() and lock.status == "released"

    asyncio.run(main())


def test_async_with_timeout_around_a_waiting_acquire(manager: LockManager, key: str, node: RedisNode) -> None:
    async def main() -> None:
        held = await manager.acquire_async(key)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                async with manager.lock(key):
                    pass
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
        await held.release_async()
        await asyncio.sleep(0.3)
        assert not node.client().exists(key)

    asyncio.run(main())


def test_each_blocking_thread_has_its_own_connection_closed_when_it_ends(key: str) -> None:
    from conftest import RedisNode

    node = RedisNode()  # its own server: the connections are this test's alone
    try:
        admin = node.client()

        def releasers() -> int:
            """Connections whose last command was a release (EVALSHA): the lock connections."""
            return sum(1 for c in admin.client_list() if c.get("cmd") == "evalsha")

        manager = LockManager([node.url], ttl=5, watchdog=False)
        gate = threading.Barrier(6)
        errors: list[BaseException] = []

        def work(i: int) -> None:
            try:
                with manager.lock(f"{key}:{i}"):
                    pass
                gate.wait(10)  # counted while every thread is alive
                gate.wait(10)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(5)]
        for t in threads:
            t.start()
        gate.wait(10)
        during = releasers()
        gate.wait(10)
        for t in threads:
            t.join(10)
        assert not errors, errors
        assert during == 5, f"{during} lock connections for 5 threads"
        # A thread's connections end with the thread.
        deadline = time.monotonic() + 5
        while releasers() != 0:
            assert time.monotonic() < deadline, f"{releasers()} lock connections left after the threads ended"
            time.sleep(0.02)
        # And the manager still works.
        with manager.lock(key):
            pass
        manager.close()
    finally:
        node.close()


def test_close_drops_the_connections_of_idle_threads(key: str) -> None:
    """Threads that locked once and stay alive, idle: close() drops their connections at once,
    not when each thread calls in again (issue 30 item 10)."""
    from conftest import RedisNode

    node = RedisNode()  # its own server: the connections are this test's alone
    try:
        admin = node.client()

        def clients() -> set[str]:
            return {c["id"] for c in admin.client_list()}

        # By id: a connection of the server's start-up (a readiness probe) may still be
        # closing, so a count taken now could be one high for good.
        before = clients()
        manager = LockManager([node.url], ttl=5, watchdog=False, restart_guard=0)
        gate = threading.Barrier(6)
        errors: list[BaseException] = []

        def work(i: int) -> None:
            try:
                with manager.lock(f"{key}:{i}"):
                    pass
                gate.wait(30)  # every thread has locked once
                gate.wait(60)  # idle (within the idle limit) until the test is done counting
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(5)]
        for t in threads:
            t.start()
        gate.wait(30)
        ours = clients() - before
        manager.close()
        deadline = time.monotonic() + 30
        while clients() & ours:
            assert time.monotonic() < deadline, f"{len(clients() & ours)} of the manager's {len(ours)} connections left after close"
            time.sleep(0.05)
        gate.wait(30)
        for t in threads:
            t.join(10)
        assert not errors, errors
        assert len(ours) >= 5, f"{len(ours)} connections with 5 threads"
    finally:
        node.close()


def test_a_cancelled_async_acquire_raises_once_it_left_the_server_queue(node: RedisNode, key: str) -> None:
    """The CancelledError comes only once the waiter is out of the server queue: raising first
    and leaving after let a try of another process right after fail."""
    holder, waiter = LockManager([node.url], restart_guard=0), LockManager([node.url], restart_guard=0)
    r = node.client()

    async def main() -> None:
        for round in range(20):
            k = f"{key}:{round}"
            queue = f"ferrolock:queue:{{{k}}}"
            held = await holder.acquire_async(k)
            task = asyncio.create_task(waiter.acquire_async(k))
            deadline = time.monotonic() + 20
            while r.zcard(queue) == 0:
                assert time.monotonic() < deadline, f"round {round}: the waiter never queued"
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert r.zcard(queue) == 0, f"round {round}: cancelled, yet still in the server queue"
            assert await held.release_async() is True

    try:
        asyncio.run(main())
    finally:
        holder.close()
        waiter.close()


def test_an_async_acquire_cancelled_as_it_is_granted_leaves_the_key_free(cluster: list[RedisNode], key: str) -> None:
    """Cancelled just as the holder's release wakes it (its grant on its way): once the await
    raised, another manager's try takes the key at once."""
    urls = [n.url for n in cluster]
    # Servers started a moment ago: their votes count at once.
    holder, waiter, other = (LockManager(urls, restart_guard=0) for _ in range(3))
    clients = [n.client() for n in cluster]

    async def main() -> None:
        cancelled = 0
        for round in range(20):
            k = f"{key}:{round}"
            queue = f"ferrolock:queue:{{{k}}}"
            held = await holder.acquire_async(k)
            task = asyncio.create_task(waiter.acquire_async(k))
            deadline = time.monotonic() + 20
            while not all(c.zcard(queue) for c in clients):
                assert time.monotonic() < deadline, f"round {round}: the waiter never queued everywhere"
                await asyncio.sleep(0.01)
            assert await held.release_async() is True
            task.cancel()
            try:
                lock = await task
            except asyncio.CancelledError:
                cancelled += 1
            else:
                assert await lock.release_async() is True
            taken = other.acquire(k, wait=0)
            assert taken.release() is True
        assert cancelled > 0, "no round was cancelled: the race never happened"

    try:
        asyncio.run(main())
    finally:
        for m in (holder, waiter, other):
            m.close()


def test_an_async_acquire_timed_out_while_nodes_are_paused_leaves_nothing(cluster: list[RedisNode], key: str) -> None:
    """`asyncio.timeout` around a waiting `async with` whose majority of nodes is paused: the
    TimeoutError comes (each undo step is bounded by the node timeout), and once the nodes
    answer again nothing of the waiter is left (no key, no queue entry past its lease), so the
    holder's release hands the lock to nobody."""
    urls = [n.url for n in cluster]
    holder, waiter, other = (LockManager(urls, restart_guard=0) for _ in range(3))
    clients = [n.client() for n in cluster]
    queue, lease = f"ferrolock:queue:{{{key}}}", f"ferrolock:queue-lease:{{{key}}}"

    async def main() -> None:
        held = await holder.acquire_async(key, ttl=30)
        ttl = 5.0
        entered = False

        async def wait() -> None:
            nonlocal entered
            async with waiter.lock(key, ttl=ttl):
                entered = True

        task = asyncio.create_task(wait())
        deadline = time.monotonic() + 20
        while not all(c.zcard(queue) for c in clients):
            assert time.monotonic() < deadline, "the waiter never queued everywhere"
            await asyncio.sleep(0.01)
        bound = 3 * min(c.pttl(lease) for c in clients) / 1000  # the waiter's own lease
        cluster[1].pause()
        cluster[2].pause()
        # Before the acquire gives up on the silent majority (QuorumUnreachable).
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await task
        assert not entered
        for n in cluster[1:]:  # the pause was real, and lasted through the cancel
            with socket.create_connection(("127.0.0.1", n.port), timeout=5) as probe:
                probe.settimeout(0.2)
                probe.sendall(b"PING\r\n")
                with pytest.raises(TimeoutError):
                    probe.recv(16)
        cluster[1].resume()
        cluster[2].resume()
        deadline = time.monotonic() + bound
        while any(c.zcard(queue) for c in clients):
            assert time.monotonic() < deadline, f"queued still: {[c.zrange(queue, 0, -1) for c in clients]}"
            await asyncio.sleep(0.05)
        assert [c.get(key) for c in clients] == [held.token] * 3
        assert await held.release_async() is True
        taken = other.acquire(key, wait=0)  # nobody was handed the lock
        assert taken.release() is True

    try:
        asyncio.run(main())
    finally:
        for n in cluster:
            n.resume()
        for m in (holder, waiter, other):
            m.close()


def test_a_blocking_acquire_of_a_key_its_event_loops_async_with_holds_is_refused(
    node: RedisNode, key: str
) -> None:
    # The event loop's thread blocking in `with m.lock(key)` while a task of that loop, in
    # `async with m.lock(key)`, holds the key: the loop can never run that block to its exit,
    # and the watchdog keeps the lock, so the wait never ended (found by a review). Refused
    # at once, as is the other way round: an awaited acquire inside a `with` block of the key
    # whose thread runs the loop.
    m = LockManager([node.url])
    refused: list[str] = []

    async def blocking_inside_async() -> None:
        async with m.lock(key):
            # wait=2: without the refusal, each would wait that long and fail unlike this.
            for call in (lambda: m.lock(key, wait=2).__enter__(), lambda: m.acquire(key, wait=2)):
                with pytest.raises(ferrolock.NotAcquired) as info:
                    call()
                refused.append(str(info.value))

    async def awaited_inside_sync() -> None:
        for call in (lambda: m.lock(key, wait=2).__aenter__(), lambda: m.acquire_async(key, wait=2)):
            with pytest.raises(ferrolock.NotAcquired) as info:
                await call()
            refused.append(str(info.value))

    try:
        asyncio.run(blocking_inside_async())
        with m.lock(key):
            asyncio.run(awaited_inside_sync())
        # Left, the blocks refuse nothing: each way round works in turn.
        asyncio.run(_take_and_release(m, key))
        with m.lock(key):
            pass
    finally:
        m.close()
    assert len(refused) == 4, refused
    assert all("event loop" in r or "runs this event loop" in r for r in refused), refused


async def _take_and_release(m: LockManager, key: str) -> None:
    async with m.lock(key):
        pass


def test_an_awaited_acquire_beside_a_with_block_in_another_task_waits_for_it(
    node: RedisNode, key: str
) -> None:
    # A `with` block inside a coroutine, across an `await`, exits in its turn: another task
    # awaiting the key waits for it and is granted (the refusal above is for a block whose
    # frame runs the loop; a review found this case refused by its first version).
    m = LockManager([node.url])

    async def holder(entered: asyncio.Event) -> None:
        with m.lock(key, wait=0):
            entered.set()
            await asyncio.sleep(0.3)

    async def waiter(entered: asyncio.Event) -> str:
        await entered.wait()
        async with m.lock(key, wait=30):
            return "granted"

    async def main() -> str:
        entered = asyncio.Event()
        _, got = await asyncio.gather(holder(entered), waiter(entered))
        return got

    try:
        assert asyncio.run(main()) == "granted"
    finally:
        m.close()
