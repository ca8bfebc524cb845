"""A ferrolock plain lock and redis-py's Lock on the same key exclude each other."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from ferrolock import LockManager, NotAcquired

from conftest import RedisNode


def test_ferrolock_holder_excludes_redis_py(node: RedisNode, manager: LockManager, key: str) -> None:
    r = redis.Redis(port=node.port)
    with manager.lock(key):
        rl = r.lock(key, timeout=5, blocking=False)
        assert rl.acquire() is False
    rl = r.lock(key, timeout=5, blocking=False)
    assert rl.acquire() is True
    rl.release()


def test_redis_py_holder_excludes_ferrolock(node: RedisNode, manager: LockManager, key: str) -> None:
    r = redis.Redis(port=node.port)
    rl = r.lock(key, timeout=10, thread_local=False)
    assert rl.acquire(blocking=False)
    with pytest.raises(NotAcquired):
        manager.acquire(key, wait=0)
    # A waiter notices a holder that publishes nothing within about one retry_delay.
    threading.Timer(0.3, rl.release).start()
    t = time.monotonic()
    with manager.lock(key, wait=5) as lock:
        waited = time.monotonic() - t
        assert r.get(key) == lock.token.encode()
    # After the release; the upper bound is a failure bound (redis-py's lock had 10 s left).
    assert 0.25 < waited < 8.0, waited
