"""A lock lost while its block runs: LockLost inside a sync `with` (injected into the
entering thread), cancellation of an `async with` body, both before the validity deadline."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from typing import Any

import pytest

from ferrolock import LockLost, LockManager, NotHeld
from ferrolock._errors import _InjectedLockLost

from conftest import RedisNode

pytestmark = pytest.mark.serial

TTL = 3.0  # long enough that a loaded 2-core machine does not flake


def _redlock(cluster: list[RedisNode], **kw: object) -> LockManager:
    return LockManager([n.url for n in cluster], ttl=TTL, restart_guard=0, **kw)  # type: ignore[arg-type]


def _pause_majority(cluster: list[RedisNode]) -> None:
    cluster[0].pause()
    cluster[1].pause()


def test_sync_with_gets_lock_lost_in_the_body_before_the_deadline(
    cluster: list[RedisNode], key: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ferrolock")
    m = _redlock(cluster)
    seen: dict[str, object] = {}
    try:
        with pytest.raises(LockLost) as info:
            with m.lock(key) as lock:
                _pause_majority(cluster)
                start = time.monotonic()
                try:
                    while time.monotonic() - start < 3 * TTL:
                        time.sleep(0.005)
                except LockLost as e:
                    seen["at"] = time.monotonic()
                    seen["deadline"] = lock.deadline
                    seen["inner"] = e
                    raise
                raise AssertionError("LockLost never arrived in the body")
        assert seen, "the body was not interrupted"
        assert seen["at"] < seen["deadline"], seen  # type: ignore[operator]
        assert isinstance(seen["inner"], LockLost)
        outer = info.value
        assert type(outer) is LockLost  # the placeholder was replaced
        assert outer.key == key and key in str(outer) and "lost" in str(outer)
        assert lock.lost and lock.loss_reason
        with pytest.raises(LockLost):
            lock.check()
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline and not any("lost" in r.getMessage() for r in caplog.records):
            time.sleep(0.02)
        assert any(r.name == "ferrolock" and "lost" in r.getMessage() for r in caplog.records)
    finally:
        for n in cluster:
            n.resume()


def test_sync_with_interrupt_false_raises_at_exit(cluster: list[RedisNode], key: str) -> None:
    m = _redlock(cluster)
    try:
        with pytest.raises(LockLost) as info:
            with m.lock(key, interrupt=False) as lock:
                _pause_majority(cluster)
                start = time.monotonic()
                while not lock.lost and time.monotonic() - start < 3 * TTL:
                    time.sleep(0.01)
                assert lock.lost
                time.sleep(0.3)  # would have been interrupted here with interrupt=True
                finished = True
        assert finished
        assert type(info.value) is LockLost and info.value.key == key
    finally:
        for n in cluster:
            n.resume()


def test_body_that_swallows_the_injection_still_raises_at_exit(node: RedisNode, key: str) -> None:
    m = LockManager([node.url], ttl=1.0)
    swallowed = []
    with pytest.raises(LockLost, match="max_hold"):
        with m.lock(key, max_hold=1.2):
            try:
                time.sleep(0.01)
                while True:
                    time.sleep(0.01)
            except LockLost as e:
                swallowed.append(e)
    assert swallowed and isinstance(swallowed[0], _InjectedLockLost)


def test_max_hold_interrupts_the_with_block(node: RedisNode, key: str) -> None:
    m = LockManager([node.url], ttl=1.0)
    t = time.monotonic()
    with pytest.raises(LockLost, match="max_hold") as info:
        with m.lock(key, max_hold=1.5):
            while time.monotonic() - t < 10:
                time.sleep(0.01)
    assert time.monotonic() - t < 5
    assert info.value.key == key


def test_the_loss_raised_inside_the_body_names_the_lock_that_was_lost(node: RedisNode, key: str) -> None:
    # Raised inside an inner block, it is the outer block's lock that was lost: the body's
    # handler (a log line, a retry) must be able to tell which, as from any other LockLost.
    m = LockManager([node.url], ttl=1.0)
    outer, inner = f"{key}:outer", f"{key}:inner"
    seen: list[LockLost] = []
    try:
        with pytest.raises(LockLost) as info:
            with m.lock(outer, max_hold=1.5) as lock:
                with m.lock(inner):
                    try:
                        # Bounded by the lock's own end (max_hold), with slack for a slow machine.
                        while time.monotonic() < lock.deadline + 10:
                            time.sleep(0.01)
                    except LockLost as e:
                        seen.append(e)
                        raise
        assert seen, "the body was not interrupted"
        assert lock.lost and "max_hold" in str(lock.loss_reason)  # the fault: max_hold reached
        assert info.value.key == outer
        assert seen[0].key == outer, (seen[0].key, str(seen[0]))
        assert f'"{outer}"' in str(seen[0]) and "max_hold" in str(seen[0]), str(seen[0])
    finally:
        m.close()


def test_watchdog_off_body_outliving_the_ttl_is_interrupted_before_expiry(node: RedisNode, key: str) -> None:
    m = LockManager([node.url])
    # Warned two node timeouts (0.8 s) before the deadline: slack for a loaded machine.
    with pytest.raises(LockLost):
        with m.lock(key, ttl=3.0, node_timeout=0.4, watchdog=False) as lock:
            try:
                while True:
                    time.sleep(0.01)
            except LockLost:
                assert lock.validity > 0 or time.monotonic() <= lock.deadline
                assert node.client().get(key) == lock.token  # still ours: warned before expiry
                raise


def test_injection_is_revoked_when_the_body_already_finished(node: RedisNode, key: str) -> None:
    """Many short blocks whose lock is lost around their exit: nothing leaks past the block."""
    m = LockManager([node.url], ttl=1.0)
    for _ in range(3):
        try:
            with m.lock(key, max_hold=0.4):
                deadline = time.monotonic() + 0.4
                while time.monotonic() < deadline:
                    pass
        except LockLost:
            pass
        # If an injection were left pending, it would fire in these lines.
        for _ in range(10000):
            pass
        time.sleep(0.05)


def test_async_with_body_is_cancelled_and_lock_lost_raised(cluster: list[RedisNode], key: str) -> None:
    async def main() -> None:
        m = _redlock(cluster)
        seen: dict[str, float] = {}
        with pytest.raises(LockLost) as info:
            async with m.lock(key) as lock:
                _pause_majority(cluster)
                try:
                    await asyncio.sleep(3 * TTL)
                except asyncio.CancelledError:
                    seen["at"] = time.monotonic()
                    seen["deadline"] = lock.deadline
                    raise
                raise AssertionError("the body was not cancelled")
        assert seen and seen["at"] < seen["deadline"], seen
        assert info.value.key == key
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0  # the cancellation did not leak
        await asyncio.sleep(0.01)  # and the task is not cancelled later

    try:
        asyncio.run(main())
    finally:
        for n in cluster:
            n.resume()


def test_async_code_hears_of_a_deleted_key_before_the_validity_ends(node: RedisNode, key: str) -> None:
    # Another client deletes the key: an `async with` body is cancelled (LockLost out of the
    # block, the task's cancellation count restored), a handle's `wait_lost()` resolves, both
    # before the validity the lock had when the key went ends.
    async def main() -> None:
        m = LockManager([node.url], ttl=TTL)
        seen: dict[str, float] = {}
        with pytest.raises(LockLost) as info:
            async with m.lock(key) as lock:
                assert node.client().delete(key) == 1
                ends = lock.deadline
                try:
                    await asyncio.sleep(3 * TTL)
                except asyncio.CancelledError:
                    seen["body"] = time.monotonic()
                    raise
        assert seen["body"] < ends, (seen, ends)
        assert info.value.key == key and asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]

        handle = await m.acquire_async(key)
        waiting = asyncio.ensure_future(handle.wait_lost())
        await asyncio.sleep(0)
        assert node.client().delete(key) == 1
        ends = handle.deadline
        reason = await asyncio.wait_for(waiting, 3 * TTL)
        assert time.monotonic() < ends and reason is not None and "token is gone" in reason, reason
        m.close()

    asyncio.run(main())


def test_async_with_interrupt_false_and_wait_lost(node: RedisNode, key: str) -> None:
    async def main() -> None:
        m = LockManager([node.url], ttl=1.0)
        with pytest.raises(LockLost, match="max_hold"):
            async with m.lock(key, max_hold=1.2, interrupt=False) as lock:
                reason = await asyncio.wait_for(lock.wait_lost(), 10)
                assert reason and "max_hold" in reason
                await asyncio.sleep(0.1)  # not cancelled
        lock2 = await m.acquire_async(key + ":2")
        waiter = asyncio.create_task(lock2.wait_lost())
        await lock2.release_async()
        assert await asyncio.wait_for(waiter, 5) is None

    asyncio.run(main())


def test_lost_lock_check_and_extend(node: RedisNode, key: str) -> None:
    m = LockManager([node.url], ttl=1.0)
    lock = m.acquire(key, max_hold=1.2)
    deadline = time.monotonic() + 10
    while not lock.lost and time.monotonic() < deadline:
        time.sleep(0.02)
    assert lock.lost and lock.status == "lost"
    with pytest.raises(LockLost, match="max_hold"):
        lock.check()
    with pytest.raises(LockLost):
        lock.extend()
    try:
        lock.release()
    except NotHeld:
        pass
    m.close()


def test_other_threads_are_not_interrupted(node: RedisNode, key: str) -> None:
    m = LockManager([node.url], ttl=1.0)
    errors: list[BaseException] = []
    stop = threading.Event()

    def bystander() -> None:
        try:
            while not stop.is_set():
                time.sleep(0.005)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=bystander)
    t.start()
    with pytest.raises(LockLost):
        with m.lock(key, max_hold=1.2):
            time.sleep(0.01)
            while True:
                time.sleep(0.01)
    stop.set()
    t.join()
    assert not errors


def _wait_lost(lock: object) -> None:
    deadline = time.monotonic() + 10
    while not lock.lost and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.02)
    assert lock.lost, "the lock was never declared lost"  # type: ignore[attr-defined]


def test_release_all_releases_a_lost_lock_whose_token_still_stands(node: RedisNode, key: str) -> None:
    # max_hold declares the lock lost while its key still has most of its 30 s ttl.
    m = LockManager([node.url], ttl=30.0)
    lock = m.acquire(key, max_hold=0.5)
    _wait_lost(lock)
    r = node.client()
    assert r.get(key) == lock.token, "the loss left no token to release"
    m.release_all()
    assert not r.exists(key), "release_all left a lost lock's token until its ttl"
    m.close()


@pytest.mark.parametrize("end", ["close", "release_all"])
def test_a_block_whose_manager_releases_its_lock_is_told(node: RedisNode, key: str, end: str) -> None:
    # Another thread's close() or release_all() releases the lock under a running block: the
    # block is interrupted with LockLost, as for any loss, instead of going on unprotected.
    m = LockManager([node.url], ttl=TTL)
    entered = threading.Event()
    outcome: dict[str, object] = {}

    def body() -> None:
        try:
            with m.lock(key):
                entered.set()
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    time.sleep(0.01)
            outcome["end"] = "the body ran to its end"
        except LockLost as e:
            outcome["end"] = e

    t = threading.Thread(target=body)
    t.start()
    assert entered.wait(20)
    getattr(m, end)()
    t.join(60)
    assert not t.is_alive()
    assert isinstance(outcome["end"], LockLost), outcome
    assert "its manager released it" in str(outcome["end"])
    assert not node.client().exists(key)
    m.close()


def test_a_loss_is_not_raised_into_another_task_while_the_block_awaits(node: RedisNode, key: str) -> None:
    # A sync `with` in a coroutine that awaits: while it is suspended, the event loop runs
    # other tasks, into which the loss must not be raised; the block gets it once it runs.
    m = LockManager([node.url], ttl=1.0)

    async def main() -> None:
        held, go_on = asyncio.Event(), asyncio.Event()
        box: dict[str, object] = {}

        async def holder() -> str:
            with m.lock(key) as lock:
                box["lock"] = lock
                held.set()
                await go_on.wait()
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    sum(range(1000))
            return "the resumed body was never interrupted"

        task = asyncio.create_task(holder())
        await held.wait()
        lock = box["lock"]
        node.client().delete(key)
        # Busy in this other task while the loss is declared and for a while after.
        deadline = time.monotonic() + 20
        while not lock.lost and time.monotonic() < deadline:  # type: ignore[attr-defined]
            sum(range(1000))
        assert lock.lost, "the lock was never declared lost"  # type: ignore[attr-defined]
        until = time.monotonic() + 1.0
        while time.monotonic() < until:
            sum(range(1000))
        go_on.set()
        with pytest.raises(LockLost):
            await task

    asyncio.run(main())
    m.close()


def test_a_contextmanager_around_a_block_still_interrupts_its_callers_body(node: RedisNode, key: str) -> None:
    # The block's generator is suspended at its `yield` while the caller's body runs: that
    # body is what the lock guards, and is interrupted.
    m = LockManager([node.url], ttl=1.0)

    @contextlib.contextmanager
    def job():  # type: ignore[no-untyped-def]
        with m.lock(key) as lock:
            yield lock

    with pytest.raises(LockLost):
        with job():
            node.client().delete(key)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                time.sleep(0.01)
    m.close()


def test_with_and_async_with_end_alike_when_the_key_is_gone(node: RedisNode, key: str) -> None:
    # One decision and one wording for both (the core's host::scope): the key deleted behind
    # a lock's back (watchdog off, long ttl, so nothing notices before the exit) is reported
    # by the exit as LockLost, with no cause shown, the same way in both.
    m = LockManager([node.url], ttl=60, watchdog=False)

    def sync_end() -> LockLost:
        with pytest.raises(LockLost) as info:
            with m.lock(key):
                node.client().delete(key)
        return info.value

    async def async_end() -> LockLost:
        with pytest.raises(LockLost) as info:
            async with m.lock(key):
                node.client().delete(key)
        return info.value

    try:
        sync_err, async_err = sync_end(), asyncio.run(async_end())
        assert str(sync_err) == str(async_err)
        assert "no longer held on a quorum when the scope ended" in str(sync_err)
        for err in (sync_err, async_err):
            assert err.key == key and err.__cause__ is None and err.__suppress_context__
    finally:
        m.close()


def test_a_handle_used_as_a_context_ends_as_every_scope_does(
    node: RedisNode, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    # `with manager.acquire(key) as lock:` follows host::scope's table too: a key found gone
    # at the exit raises LockLost (the exit returned quietly), and a release that fails after
    # the body raised is logged while the body's own exception goes through (the release's
    # error replaced it, with no trace of it).
    caplog.set_level(logging.WARNING, logger="ferrolock")
    m = LockManager([node.url], ttl=60, watchdog=False, node_timeout=0.2)
    try:
        with pytest.raises(LockLost) as info:
            with m.acquire(key):
                node.client().delete(key)
        assert "no longer held on a quorum when the scope ended" in str(info.value)
        assert info.value.key == key

        class BodyError(Exception):
            pass

        with pytest.raises(BodyError):
            with m.acquire(key):
                node.pause()
                raise BodyError("the body's own")
        # The fault happened: the release failed (and was logged, not raised).
        assert any(
            r.name == "ferrolock" and "while ending the scope after the body failed" in r.getMessage()
            for r in caplog.records
        ), [r.getMessage() for r in caplog.records]
    finally:
        node.resume()
        m.close()


def test_a_loss_callback_may_release_and_wait_to_acquire(node: RedisNode, key: str) -> None:
    """The loss callback runs on a library thread (the core's blocking pool, which carries the
    runtime's context): a release and a waiting acquire from it work, they are not refused
    as async code."""
    m = LockManager([node.url], ttl=TTL, restart_guard=0)
    other = LockManager([node.url], restart_guard=0)
    held = f"{key}:held"
    blocker = other.acquire(held)
    lock = m.acquire(key)
    seen: dict[str, object] = {}
    started, finished = threading.Event(), threading.Event()

    def on_lost(_reason: str) -> None:
        started.set()
        try:
            seen["release"] = lock.release()
        except BaseException as e:  # noqa: BLE001 - the test reports whatever it was
            seen["release"] = e
        try:
            # `blocker` is released once this callback has started: a real wait.
            got = m.acquire(held, wait=60)
            seen["acquired"] = got.locked()
            seen["released"] = got.release()
        except BaseException as e:  # noqa: BLE001
            seen["acquired"] = e
        finished.set()

    lock._notify_lost(on_lost)
    node.client().delete(key)  # the watchdog finds the key gone: the lock is lost
    assert started.wait(60), "the loss was never signalled"
    blocker.release()
    assert finished.wait(60), seen
    # A lock whose key is gone releases as "not ours" (False) or says it is lost.
    assert seen["release"] is False or isinstance(seen["release"], LockLost), seen
    assert seen["acquired"] is True and seen["released"] is True, seen
    m.close()
    other.close()


def _end_or_acquire(m: LockManager, key: str, action: str, r: object) -> object:
    """What a loss handler does next; returns what the test checks."""
    if action == "close":
        m.close()
        return m.closed
    if action == "release_all":
        return m.release_all()
    got = m.acquire(f"{key}:new", wait=30)
    held = r.get(f"{key}:new") == got.token  # type: ignore[attr-defined]
    return held and got.release()


# What each action leaves: close() and release_all() give back the manager's other lock
# (release_all counts it: the lost lock's key is gone); an acquire leaves it held.
_EXPECTED = {"close": (True, False), "release_all": (1, False), "acquire": (True, True)}


def _check_what_was_left(m: LockManager, r: Any, key: str, action: str, seen: dict[str, object]) -> None:
    """The action's result, the manager's other lock kept or released as the action says, and
    nothing of the lost lock or of the new one left; closing releases the rest."""
    result, other_kept = _EXPECTED[action]
    assert seen["result"] == result, seen
    assert r.exists(f"{key}:other") == other_kept
    assert not r.exists(key) and not r.exists(f"{key}:new")
    m.close()
    assert not r.exists(f"{key}:other")


@pytest.mark.parametrize("action", sorted(_EXPECTED))
def test_a_loss_callback_may_close_release_all_or_acquire(node: RedisNode, key: str, action: str) -> None:
    m = LockManager([node.url], ttl=TTL, restart_guard=0)
    r = node.client()
    other = m.acquire(f"{key}:other")
    lock = m.acquire(key)
    seen: dict[str, object] = {}
    finished = threading.Event()

    def on_lost(reason: str) -> None:
        seen["reason"] = reason
        try:
            seen["result"] = _end_or_acquire(m, key, action, r)
        except BaseException as e:  # noqa: BLE001 - the test reports whatever it was
            seen["result"] = e
        finished.set()

    lock._notify_lost(on_lost)
    r.delete(key)  # the watchdog (every ttl/3) finds the key gone: the lock is lost
    assert finished.wait(60), f"the loss callback hung: {seen}"
    assert lock.lost and seen["reason"], seen
    _check_what_was_left(m, r, key, action, seen)


@pytest.mark.parametrize("action", sorted(_EXPECTED))
def test_after_wait_lost_close_release_all_or_acquire(node: RedisNode, key: str, action: str) -> None:
    m = LockManager([node.url], ttl=TTL, restart_guard=0)
    r = node.client()
    seen: dict[str, object] = {}

    async def main() -> None:
        other = await m.acquire_async(f"{key}:other")
        lock = await m.acquire_async(key)
        lost = asyncio.create_task(lock.wait_lost())
        await asyncio.sleep(0.1)  # the task is waiting before the loss
        r.delete(key)
        seen["reason"] = await asyncio.wait_for(lost, 60)
        if action == "acquire":
            got = await m.acquire_async(f"{key}:new", wait=30)
            seen["result"] = r.get(f"{key}:new") == got.token and await got.release_async()
        else:
            seen["result"] = _end_or_acquire(m, key, action, r)  # close() and release_all() are sync only
        seen["other"] = other  # kept referenced until checked

    # In a thread of its own, so that a hang fails the test instead of stalling the suite.
    errors: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(90)
    assert not t.is_alive(), f"hung after wait_lost(): {seen}"
    assert not errors, errors
    assert seen["reason"], seen
    _check_what_was_left(m, r, key, action, seen)


def test_a_loss_is_not_raised_into_a_new_thread_that_has_the_entering_threads_ident(node: RedisNode, key: str) -> None:
    """A `with` block entered by hand (ExitStack) in thread A, which ends with the block still
    open. Thread B, started after, gets A's ident (glibc hands a new thread the stack, and so
    the pthread_t, of one that ended). B never touches ferrolock: the lock's loss must not be
    raised into it (it was: the loss went to the entering thread's ident). The holder hears of
    the loss when it exits the block."""
    m = LockManager([node.url], ttl=1.0)
    stack = contextlib.ExitStack()
    idents: dict[str, int] = {}
    locks: list[Any] = []
    outcome: dict[str, str] = {}
    misses = threading.Event()

    def a() -> None:
        idents["a"] = threading.get_ident()
        locks.append(stack.enter_context(m.lock(key)))

    def b() -> None:
        if threading.get_ident() != idents["a"]:
            misses.wait()  # not A's ident: kept alive (its stack in use) while another starts
            return
        idents["b"] = threading.get_ident()
        try:
            # Unrelated work, in Python (where an injected exception lands), until the loss is
            # declared and well after: the injection, when there was one, came within ms.
            deadline = time.monotonic() + 30
            while not locks[0].lost and time.monotonic() < deadline:
                time.sleep(0.01)
            outcome["lost"] = str(locks[0].lost)
            for _ in range(200):
                time.sleep(0.01)
            outcome["b"] = "finished"
        except BaseException as e:  # noqa: BLE001 - what reached B is what the test checks
            outcome["b"] = repr(e)

    # A stack size nothing else uses, so that no other thread (the suite's, the core's runtime
    # threads) takes A's cached stack before B does: glibc then hands B that stack, and with it
    # A's ident.
    old_size = threading.stack_size(12 * 1024 * 1024)
    started: list[threading.Thread] = []
    try:
        ta = threading.Thread(target=a)
        ta.start()
        ta.join()
        assert locks and locks[0].locked()
        time.sleep(0.2)  # until the kernel has marked A's stack free (CLONE_CHILD_CLEARTID)
        for _ in range(200):
            tb = threading.Thread(target=b)
            tb.start()
            started.append(tb)
            time.sleep(0.02)
            if "b" in idents:
                break
    finally:
        threading.stack_size(old_size)
        misses.set()
    if "b" not in idents:
        stack.close()
        m.close()
        pytest.fail("no new thread got the ended thread's ident: the case cannot be set up here")
    node.client().delete(key)  # lost at the watchdog's next renewal (a third of the ttl)
    for t in started:
        t.join()
    with pytest.raises(LockLost):
        stack.close()
    m.close()
    assert outcome == {"lost": "True", "b": "finished"}, outcome
