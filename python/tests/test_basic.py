"""The API surface against one real redis-server."""

from __future__ import annotations

import asyncio
import logging
import pickle
import time
from datetime import timedelta
from typing import Any

import pytest

import ferrolock
from ferrolock import InvalidArgument, LockManager, NotAcquired, NotHeld, redlock

from conftest import RedisNode


def test_with_redlock_holds_the_key_and_releases_it(node: RedisNode, key: str) -> None:
    r = node.client()
    # Bounds from when the block was entered, not from how fast this machine is: the key was
    # set after `entered`, and the validity is the ttl less the drift (10 s x 0.01 + 2 ms)
    # less the time since the attempt started.
    entered = time.monotonic()
    with redlock(key, nodes=[node.url], ttl=10.0, wait=5.0) as lock:
        validity = lock.validity
        pttl = r.pttl(key)
        since = time.monotonic() - entered
        assert 9.898 - since - 0.002 <= validity <= 9.899, (validity, since)
        assert 10_000 - since * 1000 - 2 <= pttl <= 10_000, (pttl, since)
        before = time.monotonic()
        deadline, validity = lock.deadline, lock.validity
        after = time.monotonic()
        assert before + validity - 0.002 <= deadline <= after + validity + 0.002
        assert r.get(key) == lock.token
        # The attempt's time in ms (12 hex digits), '-', 80 random bits (20 hex digits).
        stamp, rand = lock.token.split("-")
        assert len(stamp) == 12 and len(rand) == 20, lock.token
        assert abs(int(stamp, 16) / 1000 - time.time()) < 60, lock.token
        assert lock.fence is None
        assert lock.key == key
        assert lock.locked() and lock.owned()
        assert lock.status == "held" and not lock.lost and lock.loss_reason is None
        lock.check()
    assert r.get(key) is None
    assert not lock.locked()
    assert lock.validity == 0.0
    assert lock.status == "released"
    with pytest.raises(NotHeld) as info:
        lock.check()
    assert info.value.key == key


def test_acquire_wait_zero_raises_not_acquired_naming_the_key(manager: LockManager, key: str) -> None:
    held = manager.acquire(key)
    t = time.monotonic()
    with pytest.raises(NotAcquired) as info:
        manager.acquire(key, wait=0)
    # A failure bound, not a speed claim: an acquire that waited would wait for the ttl (10 s).
    assert time.monotonic() - t < 8.0
    assert info.value.key == key
    assert info.value.code == "NOT_ACQUIRED"
    assert key in str(info.value)
    assert held.release() is True


def test_wait_budget_is_spent_then_not_acquired(manager: LockManager, key: str) -> None:
    held = manager.acquire(key)
    t = time.monotonic()
    with pytest.raises(NotAcquired):
        manager.acquire(key, wait=timedelta(milliseconds=400))
    elapsed = time.monotonic() - t
    # At least the budget; at most a failure bound far below the holder's ttl (10 s).
    assert 0.35 <= elapsed < 8.0, elapsed
    held.release()


def test_waiter_gets_the_lock_soon_after_release(
    manager: LockManager, node: RedisNode, key: str
) -> None:
    """A queued waiter is woken by the release itself: granted long before its own re-check
    (retry_delay 30 s, so 15 s at the earliest, and the holder's 60 s ttl), however slow the
    machine."""
    import threading

    held = manager.acquire(key, ttl=60)
    got: list[float] = []

    def waiter() -> None:
        lock = manager.acquire(key, wait=60, retry_delay=30)
        got.append(time.monotonic())
        lock.release()

    t = threading.Thread(target=waiter)
    t.start()
    queue = f"ferrolock:queue:{{{key}}}"
    deadline = time.monotonic() + 30
    while node.client().zcard(queue) == 0:
        assert time.monotonic() < deadline, "the waiter never queued"
        time.sleep(0.01)
    released_at = time.monotonic()
    held.release()
    t.join(60)
    assert got, "the waiter was never granted"
    assert released_at <= got[0] < released_at + 15, got[0] - released_at


def test_wait_inf_blocks_until_acquired_as_none_does(manager: LockManager, key: str) -> None:
    import math
    import threading

    held = manager.acquire(key)
    outcome: list[object] = []

    def waiter() -> None:
        try:
            lock = manager.acquire(key, wait=math.inf)
            outcome.append(lock.locked())
            lock.release()
        except Exception as e:  # noqa: BLE001 - the test reports what the waiter raised
            outcome.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    t.join(0.5)
    # Still waiting while the key is held: neither refused as "too long" nor given up.
    assert t.is_alive() and not outcome, outcome
    held.release()
    t.join(30)
    assert outcome == [True], outcome


def test_a_nested_acquire_of_a_held_key_in_its_thread_is_refused_not_left_waiting(
    node: RedisNode, manager: LockManager, key: str
) -> None:
    import threading

    # interrupt=False: the loss made below must not be raised into this body; the block's exit
    # reports it.
    with pytest.raises(ferrolock.LockLost), manager.lock(key, interrupt=False) as outer:
        # A bounded wait, so that a build without the check fails here rather than hangs.
        for nested in (lambda: manager.acquire(key, wait=2), lambda: manager.lock(key, wait=2).__enter__()):
            with pytest.raises(NotAcquired) as info:
                nested()
            assert "inside a `with` block that holds it" in str(info.value), str(info.value)
        # Another thread waits its turn as ever.
        other: list[BaseException] = []
        th = threading.Thread(target=lambda: other.extend(_raised(lambda: manager.acquire(key, wait=0))))
        th.start()
        th.join(30)
        assert len(other) == 1 and "inside a `with` block" not in str(other[0]), other
        assert isinstance(other[0], NotAcquired)
        assert outer.locked()
        # Once the block's lock is lost, its key is someone else's to wait for.
        node.client().delete(key)
        with pytest.raises(ferrolock.LockLost):
            outer.extend()
        again = manager.acquire(key, wait=5)
        assert again.locked()
        again.release()
    # wait=None (for ever): refused as well, in a thread of its own so that a hang shows as a
    # failure, not as a stuck run.
    seen: list[BaseException] = []

    def holder() -> None:
        with manager.lock(key):
            seen.extend(_raised(lambda: manager.acquire(key)))

    th = threading.Thread(target=holder, daemon=True)
    th.start()
    th.join(60)
    assert not th.is_alive(), "a nested acquire with wait=None waited for itself"
    assert len(seen) == 1 and isinstance(seen[0], NotAcquired), seen
    # A block whose lock was released early holds nothing to wait for.
    with manager.lock(key) as early:
        assert early.release() is True
        manager.acquire(key, wait=5).release()
    # redlock() on the same nodes shares one manager: nested, it is refused as well.
    with ferrolock.redlock(key, nodes=[node.url]):
        with pytest.raises(NotAcquired) as info:
            ferrolock.redlock(key, nodes=[node.url], wait=2).__enter__()
        assert "inside a `with` block that holds it" in str(info.value), str(info.value)
    # Both reentrant: the thread re-enters.
    with manager.lock(key, reentrant=True):
        with manager.lock(key, reentrant=True) as inner:
            assert inner.locked()
    # The same server written apart (another manager, so another owner, even reentrant):
    # refused as well, not left waiting for itself. Another database is another key.
    with ferrolock.redlock(key, nodes=[node.url], reentrant=True):
        for other in ({"nodes": [node.url + "/0"]}, {"nodes": [node.url + "/0"], "reentrant": True}):
            with pytest.raises(NotAcquired) as info:
                ferrolock.redlock(key, wait=2, **other).__enter__()  # type: ignore[arg-type]
            assert "inside a `with` block that holds it (on the same servers)" in str(info.value)
        with ferrolock.redlock(key, nodes=[node.url + "/1"], wait=2) as elsewhere:
            assert elsewhere.locked()


def _raised(call: Any) -> list[BaseException]:
    try:
        call()
    except BaseException as e:  # noqa: BLE001 - returned to the test
        return [e]
    return []


def test_extend_resets_the_ttl_and_release_twice_is_not_held(node: RedisNode, manager: LockManager, key: str) -> None:
    lock = manager.acquire(key, ttl=2.0, watchdog=False)
    time.sleep(0.3)
    assert lock.validity < 1.8
    # Bounds from when extend was called (drift: ttl x 0.01 + 2 ms), whatever the speed.
    t = time.monotonic()
    v = lock.extend()
    assert 1.978 - (time.monotonic() - t) - 0.002 <= v <= 1.979, v
    t = time.monotonic()
    v = lock.extend(ttl=5)
    pttl = node.client().pttl(key)
    since = time.monotonic() - t
    assert 4.948 - since - 0.002 <= v <= 4.949, (v, since)
    assert pttl >= 5000 - since * 1000 - 2, (pttl, since)
    assert lock.release() is True
    with pytest.raises(NotHeld):
        lock.release()
    with pytest.raises(NotHeld):
        lock.extend()


def test_max_extensions_caps_manual_extends(manager: LockManager, key: str) -> None:
    lock = manager.acquire(key, max_extensions=1)
    lock.extend()
    # The caller's own cap, not a loss: the lock is still held.
    with pytest.raises(InvalidArgument, match="max_extensions=1 reached"):
        lock.extend()
    assert lock.status == "held"
    assert lock.release()


def test_fencing_tokens_increase_with_every_grant(manager: LockManager, key: str) -> None:
    fences = []
    for _ in range(3):
        with manager.lock(key, fencing=True) as lock:
            assert lock.fence is not None
            fences.append(lock.fence)
    assert fences == sorted(fences) and len(set(fences)) == 3


def test_dropping_the_last_reference_releases(node: RedisNode, manager: LockManager, key: str) -> None:
    manager.acquire(key)
    deadline = time.monotonic() + 3
    while node.client().exists(key) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not node.client().exists(key)


def test_lock_is_a_context_manager_too(node: RedisNode, manager: LockManager, key: str) -> None:
    with manager.acquire(key) as lock:
        assert node.client().get(key) == lock.token
    assert not node.client().exists(key)


def test_a_context_can_be_reused_but_not_nested(manager: LockManager, key: str) -> None:
    ctx = manager.lock(key, wait=0)
    with ctx:
        with pytest.raises(ferrolock.InvalidArgument, match="already entered"):
            ctx.__enter__()
    with ctx as lock:
        assert lock.locked()


def test_a_context_is_not_shared_between_threads_but_a_lock_handle_is(
    manager: LockManager, node: RedisNode, key: str
) -> None:
    """The token belongs to the acquisition, not to a thread (redis-py's thread-local token
    bug): another thread cannot enter a context this one is inside, but it may release a lock
    handle this thread acquired, and the key is gone then."""
    import threading

    ctx = manager.lock(key, wait=0)
    errors: list[BaseException] = []

    def enter_from_another_thread() -> None:
        try:
            with ctx:
                pass
        except BaseException as e:  # noqa: BLE001 - the error is the assertion
            errors.append(e)

    with ctx:
        t = threading.Thread(target=enter_from_another_thread)
        t.start()
        t.join(30)
        assert len(errors) == 1 and isinstance(errors[0], ferrolock.InvalidArgument), errors
    assert not node.client().exists(key)

    lock = manager.acquire(key, wait=0)
    released: list[bool] = []
    t = threading.Thread(target=lambda: released.append(lock.release()))
    t.start()
    t.join(30)
    assert released == [True]
    assert not node.client().exists(key)
    assert not lock.locked()


def test_an_exception_in_a_plain_lock_block_releases_the_key(
    manager: LockManager, node: RedisNode, key: str
) -> None:
    with pytest.raises(ValueError, match="the body failed"):
        with manager.lock(key, wait=0) as lock:
            assert node.client().get(key) == lock.token
            raise ValueError("the body failed")
    assert not node.client().exists(key)
    assert not lock.locked()


def test_a_context_entered_one_way_refuses_the_other_and_shows_its_lock(manager: LockManager, key: str) -> None:
    ctx = manager.lock(key, wait=0)

    async def enter_async() -> None:
        async with ctx:
            pass

    with ctx as lock:
        assert ctx.lock is lock
        with pytest.raises(ferrolock.InvalidArgument, match="already entered"):
            asyncio.run(enter_async())
    assert ctx.lock is None

    async def both() -> None:
        async with ctx as lock:
            assert ctx.lock is lock
            with pytest.raises(ferrolock.InvalidArgument, match="already entered"):
                with ctx:
                    pass
        assert ctx.lock is None

    asyncio.run(both())


def test_redlock_shares_one_manager_per_connection_options(node: RedisNode, key: str) -> None:
    shared_count = ferrolock._ferrolock._Manager.shared_count
    before = shared_count()
    for _ in range(20):
        with redlock(key, nodes=[node.url], ttl=5):
            pass
    assert shared_count() - before <= 1
    with redlock(key, nodes=[node.url], ttl=7, wait=1):
        pass
    assert shared_count() - before <= 1
    # The same server by another spelling (one comma-separated string) is the same node list.
    for _ in range(5):
        with redlock(key, nodes=node.url):
            pass
    assert shared_count() - before <= 2


def test_nodes_from_environment(node: RedisNode, key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERROLOCK_NODES", node.url)
    m = LockManager()
    assert m.nodes == [node.url]
    with m.lock(key) as lock:
        assert node.client().get(key) == lock.token
    with redlock(key) as lock:
        assert node.client().get(key) == lock.token
    m.close()


def test_nodes_takes_any_sequence_of_str_as_the_stub_declares(node: RedisNode, key: str) -> None:
    # The stub says `nodes: str | Sequence[str] | None`: what mypy lets through works.
    import collections

    for nodes in (collections.UserList([node.url]), collections.deque([node.url]), (node.url,)):
        m = LockManager(nodes)
        assert m.nodes == [node.url], nodes
        with m.lock(key) as lock:
            assert node.client().get(key) == lock.token
        m.close()
        with redlock(key, nodes=nodes) as lock:
            assert node.client().get(key) == lock.token
    # A wrong item in one is named, inside its type.
    with pytest.raises(InvalidArgument, match=r"^LockManager: nodes=deque\(\['redis://[^']*', 5\]\) \(deque\): expected a list"):
        LockManager(collections.deque([node.url, 5]))  # type: ignore[list-item]
    # Bytes are a sequence too (of ints): refused, saying why.
    for raw in (node.url.encode(), bytearray(node.url.encode()), memoryview(node.url.encode())):
        with pytest.raises(InvalidArgument, match=r"^LockManager: nodes=<\w+> \(\w+\): bytes are not text: pass the node URLs as str"):
            LockManager(raw)  # type: ignore[arg-type]
    # Not a sequence: a set has no order, a dict's keys are no list.
    for unordered in ({node.url}, {node.url: 1}):
        with pytest.raises(InvalidArgument, match=r"expected a list \(or any sequence\) of node URLs"):
            LockManager(unordered)  # type: ignore[arg-type]


@pytest.mark.parametrize("blank", ["", "  "])
def test_a_blank_ferrolock_nodes_is_refused_by_name(key: str, monkeypatch: pytest.MonkeyPatch, blank: str) -> None:
    # Set but empty (FERROLOCK_NODES=$REDIS_URL with REDIS_URL unset) is not "unset": the
    # local node in its place would lock apart from every peer on the real servers.
    monkeypatch.setenv("FERROLOCK_NODES", blank)
    with pytest.raises(InvalidArgument, match="^FERROLOCK_NODES: set but empty"):
        LockManager()
    # The shared manager of redlock() names it too.
    with pytest.raises(InvalidArgument, match="^FERROLOCK_NODES: set but empty"):
        with redlock(key):
            pass


def test_manager_options_are_lock_defaults(manager: LockManager, node: RedisNode, key: str) -> None:
    m = LockManager([node.url], ttl=timedelta(seconds=3), wait=0, interrupt=False)
    d = m.defaults
    assert d["ttl"] == 3.0 and d["wait"] == 0.0 and d["interrupt"] is False
    # Derived from each lock's ttl, so not a number that would pin it if passed back.
    assert d["node_timeout"] is None and d["max_hold"] is None
    assert LockManager([node.url], node_timeout=0.25).defaults["node_timeout"] == 0.25
    assert m.lock(key).interrupt is False
    assert m.lock(key, interrupt=True).interrupt is True
    with m.lock(key) as lock:
        assert 2.0 < lock.validity <= 3.0
        with pytest.raises(NotAcquired):
            m.acquire(key)  # wait=0 from the manager's defaults
    assert m.quorum == 1
    m.close()


def test_closed_manager_refuses_and_released_its_locks(node: RedisNode, key: str) -> None:
    with LockManager([node.url]) as m:
        lock = m.acquire(key)
        assert node.client().exists(key)
    assert m.closed
    assert not node.client().exists(key)
    # Released by close() while its handle still held it: its holder is told it lost it.
    assert lock.status == "lost" and lock.lost
    with pytest.raises(ferrolock.InvalidArgument, match="closed"):
        m.acquire(key)
    m.close()  # idempotent


def _queue_keys(node: RedisNode, key: str) -> list[str]:
    """The key's queue keys on node (DESIGN.md, "Waiter queue")."""
    return sorted(node.client().scan_iter(match=f"ferrolock:queue*:{{{key}}}"))


def test_close_ends_the_waits_and_leaves_no_queue_entry(cluster: list[RedisNode], key: str) -> None:
    """close() ends the acquires waiting on the manager (a blocking one in a thread, an
    asyncio one) with NotAcquired naming the close, and leaves no queue entry of them on any
    node; the holder's key stays its own (issue 29 item 4)."""
    import asyncio
    import threading

    urls = [n.url for n in cluster]
    holder = LockManager(urls, restart_guard=0, ttl=60)
    held = holder.acquire(key)
    m = LockManager(urls, restart_guard=0)
    outcomes: list[BaseException | None] = []

    def blocked() -> None:
        try:
            m.acquire(key).release()
            outcomes.append(None)
        except BaseException as e:  # noqa: BLE001 - the outcome is what the test checks
            outcomes.append(e)

    async def awaited() -> None:
        try:
            (await m.acquire_async(key)).release()
            outcomes.append(None)
        except BaseException as e:  # noqa: BLE001
            outcomes.append(e)

    threads = [threading.Thread(target=blocked), threading.Thread(target=lambda: asyncio.run(awaited()))]
    for t in threads:
        t.start()
    # The fault: the waiters sit in the key's queue on every node.
    deadline = time.monotonic() + 30
    while not all(_queue_keys(n, key) for n in cluster) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert all(_queue_keys(n, key) for n in cluster), "the waiters never queued on every node"
    m.close()
    for t in threads:
        t.join(30)
    if any(t.is_alive() for t in threads):
        held.release()  # lets the waiters go, so that the test ends
        pytest.fail("an acquire went on waiting after close()")
    assert len(outcomes) == 2
    for e in outcomes:
        assert isinstance(e, NotAcquired) and "closed" in str(e), repr(e)
    assert [_queue_keys(n, key) for n in cluster] == [[], [], []]
    assert held.locked() and all(n.client().get(key) == held.token for n in cluster)
    with pytest.raises(NotAcquired):
        LockManager(urls, restart_guard=0, wait=0).acquire(key)
    held.release()
    holder.close()


def test_owned_is_false_in_another_thread(manager: LockManager, key: str) -> None:
    import threading

    lock = manager.acquire(key)
    seen: list[bool] = []
    t = threading.Thread(target=lambda: seen.append(lock.owned()))
    t.start()
    t.join()
    assert lock.owned() and seen == [False]
    lock.release()


def test_owned_is_true_in_a_sync_block_run_by_a_coroutine(manager: LockManager, key: str) -> None:
    # Sync code's owner is the thread even inside a coroutine (an async web handler's `with`):
    # owned() there compared the lock's thread owner with the running task's and said False.
    async def main() -> tuple[bool, bool, bool, bool]:
        with manager.lock(key) as lock:
            in_block = lock.owned()
        handle = manager.acquire(key)
        by_acquire = handle.owned()
        handle.release()
        async with manager.lock(key) as lock:
            in_async_block = lock.owned()

            async def peek() -> bool:
                return lock.owned()

            other_task = await asyncio.create_task(peek())
        return in_block, by_acquire, in_async_block, other_task

    assert asyncio.run(main()) == (True, True, True, False)


def test_a_log_level_set_after_the_manager_was_made_applies(
    node: RedisNode, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A manager made at import, logging configured later in main(): the level was read only
    # when a manager was made, so the later DEBUG level never reached the library.
    caplog.set_level(logging.WARNING, logger="ferrolock")
    m = LockManager([node.url])
    caplog.set_level(logging.DEBUG, logger="ferrolock")
    lock = m.acquire(key, watchdog=False)
    node.client().delete(key)
    assert lock.release() is False
    deadline = time.monotonic() + 5
    words = f"lock {key!r}".replace("'", '"') + " was no longer ours"
    while not any(words in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert any(r.levelno == logging.DEBUG and words in r.getMessage() for r in caplog.records), [
        r.getMessage() for r in caplog.records
    ]
    m.close()


def test_exceptions_pickle_with_their_key() -> None:
    e = ferrolock.LockLost("lock 'k' lost: because", "k")
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is ferrolock.LockLost and e2.key == "k" and str(e2) == str(e) and e2.code == "LOCK_LOST"


def test_exceptions_pickle_with_their_notes_and_attributes(manager: LockManager, key: str) -> None:
    # What a multiprocessing worker's exception carries to its parent: as any exception's, the
    # notes added to it (`add_note`, Python 3.11) and the attributes set on it, not only the key.
    with manager.lock(key):
        with pytest.raises(NotAcquired) as info:
            manager.acquire(key, wait=0)
    e = info.value
    e.add_note(f"while doing job 7 of {key}")
    e.job = 7  # type: ignore[attr-defined]
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is NotAcquired and e2.key == key and str(e2) == str(e)
    assert getattr(e2, "__notes__", None) == [f"while doing job 7 of {key}"]
    assert getattr(e2, "job", None) == 7


def test_exception_hierarchy() -> None:
    for cls in (ferrolock.NotAcquired, ferrolock.NotHeld, ferrolock.LockLost, ferrolock.QuorumUnreachable,
                ferrolock.RedisError, ferrolock.InvalidArgument):
        assert issubclass(cls, ferrolock.LockError)
    assert issubclass(ferrolock.InvalidArgument, ValueError)
    assert issubclass(ferrolock.InvalidArgument, TypeError)
    codes = {c.code for c in (ferrolock.NotAcquired, ferrolock.NotHeld, ferrolock.LockLost,
                              ferrolock.QuorumUnreachable, ferrolock.RedisError, ferrolock.InvalidArgument)}
    assert codes == {"NOT_ACQUIRED", "NOT_HELD", "LOCK_LOST", "QUORUM_UNREACHABLE", "REDIS_ERROR", "INVALID_ARGUMENT"}


def test_repr_shows_key_and_state(manager: LockManager, key: str) -> None:
    with manager.lock(key, fencing=True) as lock:
        r = repr(lock)
        assert key in r and "held" in r and "fence=" in r
    assert "released" in repr(lock)
    assert "LockManager" in repr(manager)


def test_a_contexts_repr_names_its_kind(manager: LockManager, key: str) -> None:
    # A read, write or semaphore context read as a lock's: `<ferrolock.LockContext key=...>`.
    assert repr(manager.lock(key)) == f'<ferrolock.LockContext lock key="{key}">'
    assert repr(manager.read_lock(key)) == f'<ferrolock.LockContext read lock key="{key}">'
    assert repr(manager.write_lock(key)) == f'<ferrolock.LockContext write lock key="{key}">'
    assert (
        repr(manager.semaphore(key, permits=5, count=2))
        == f'<ferrolock.LockContext semaphore key="{key}" permits=5 count=2>'
    )


def test_a_locks_repr_names_its_kind(manager: LockManager, key: str) -> None:
    # As its context's does: a read or write hold, or a semaphore's permits, read as a lock's.
    with manager.lock(key) as lock:
        assert repr(lock).startswith(f'<ferrolock.Lock key="{key}" status=held'), repr(lock)
    with manager.read_lock(key) as lock:
        assert repr(lock).startswith(f'<ferrolock.Lock read lock key="{key}" status=held'), repr(lock)
    with manager.write_lock(key) as lock:
        assert repr(lock).startswith(f'<ferrolock.Lock write lock key="{key}" status=held'), repr(lock)
    with manager.semaphore(f"{key}:s", permits=5, count=2) as lock:
        assert repr(lock).startswith(
            f'<ferrolock.Lock semaphore key="{key}:s" permits=5 count=2 status=held'
        ), repr(lock)
    assert repr(lock).startswith(f'<ferrolock.Lock semaphore key="{key}:s" permits=5 count=2 status=released')


def test_releasing_inside_the_block_is_fine(node: RedisNode, manager: LockManager, key: str) -> None:
    import asyncio

    with manager.lock(key) as lock:
        assert lock.release() is True
        assert not node.client().exists(key)

    async def main() -> None:
        async with manager.lock(key) as lock:
            assert await lock.release_async() is True

    asyncio.run(main())


def test_one_dead_or_hung_node_of_three_fails_no_acquire(cluster: list[RedisNode], key: str) -> None:
    """Redlock's point: a majority answering is enough. One node killed, then another one
    paused (hung, answering nothing) while the first is back: each acquire, sync and async,
    is granted on the two that answer (within a wait that only a slow machine needs: an
    acquire that a dead node failed would end in QuorumUnreachable or NotAcquired)."""
    import socket

    def answers(node: RedisNode) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", node.port), timeout=1) as c:
                c.sendall(b"PING\r\n")
                return c.recv(7) == b"+PONG\r\n"
        except OSError:  # refused (dead) or timed out (hung)
            return False

    m = LockManager([n.url for n in cluster], restart_guard=0)
    try:
        cluster[0].kill()
        assert not answers(cluster[0])
        with m.lock(key, wait=10) as lock:
            assert lock.locked()
            assert [n.client().get(key) for n in cluster[1:]] == [lock.token] * 2

        async def acquire_async() -> None:
            lock = await m.acquire_async(key, wait=10)
            assert await lock.release_async()

        asyncio.run(acquire_async())
        cluster[0].start()
        cluster[2].pause()
        assert answers(cluster[0]) and not answers(cluster[2])
        with m.lock(key, wait=10) as lock:
            assert lock.locked()
    finally:
        cluster[2].resume()
        m.close()


def test_an_extend_that_finds_the_key_gone_or_taken_is_lost_and_recreates_nothing(
    manager: LockManager, node: RedisNode, key: str
) -> None:
    """The peers' "failed extend that silently re-creates the lock": deleted, or taken by
    another client, on the server, an extend (sync and async) raises LockLost, marks the lock
    lost, and leaves the server as it found it."""
    r = node.client()
    lock = manager.acquire(key, ttl=30)
    r.delete(key)
    with pytest.raises(ferrolock.LockLost):
        lock.extend(60)
    assert not lock.locked() and lock.lost
    assert not r.exists(key)

    async def taken() -> None:
        lock = await manager.acquire_async(key, ttl=30)
        r.set(key, "someone-else", px=60_000)
        with pytest.raises(ferrolock.LockLost):
            await lock.extend_async(60)
        assert lock.lost
        assert r.get(key) == "someone-else" and 0 < r.pttl(key) <= 60_000

    asyncio.run(taken())
