"""A manager used after os.fork() works in the child; the parent's lock is not released,
renewed or re-entered by the child."""

from __future__ import annotations

import gc
import multiprocessing
import os
import sys
import time
import traceback

import pytest

import ferrolock
from ferrolock import LockManager

from conftest import RedisNode

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
