"""`ferrolock.metrics()` and `ferrolock.prometheus_text()`: the core's per-process counts,
moved by a scripted sequence of acquires, releases, contention, renewals and a loss on a real
redis-server, and the text parsed by prometheus_client's own parser."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import ferrolock
from ferrolock import LockManager, NotAcquired

from conftest import RedisNode

SAFETY = 30.0  # a deadline for what must happen, never a speed bound


def _prefix() -> str:
    return f"metrics-{uuid.uuid4().hex[:8]}"


def _counts(prefix: str) -> dict[str, Any]:
    return ferrolock.metrics().get(prefix, {})


def _until(what: str, done: Any) -> None:
    deadline = time.monotonic() + SAFETY
    while not done():
        assert time.monotonic() < deadline, f"{what} did not happen within {SAFETY}s"
        time.sleep(0.01)


def test_a_scripted_sequence_moves_each_counter(manager: LockManager) -> None:
    prefix = _prefix()
    key = f"{prefix}:job-1"
    assert prefix not in ferrolock.metrics()

    # 1: acquired and released.
    manager.acquire(key, wait=0).release()
    # 2: held; a try fails (NOT_ACQUIRED); a waiter queues behind it and gets it on release.
    first = manager.acquire(key)
    with pytest.raises(NotAcquired):
        manager.acquire(key, wait=0)
    attempts = _counts(prefix)["attempts"]
    got: list[ferrolock.Lock] = []
    waiter = threading.Thread(target=lambda: got.append(manager.acquire(key, wait=SAFETY)))
    waiter.start()
    # Its second attempt (the re-check once subscribed) is counted only once it has joined the
    # queue: a grant from then on is a hand-off. Its first attempt is counted before it is sent,
    # so it may still win outright if the release overtakes it.
    _until("the waiter's re-check", lambda: _counts(prefix)["attempts"] >= attempts + 2)
    first.release()
    waiter.join(SAFETY)
    assert got, "the waiter did not get the lock"
    got[0].release()

    m = _counts(prefix)
    assert m["grants"] == 3
    assert m["handoffs"] == 1, "the waiter was granted after the release it waited for"
    assert m["failures"] == {"NOT_ACQUIRED": 1}
    assert m["attempts"] >= 4
    assert m["losses"] == {}
    assert m["wait"]["count"] == 3 and m["hold"]["count"] == 3
    for h in (m["wait"], m["hold"]):
        bounds = [b for b, _ in h["buckets"]]
        assert bounds == sorted(bounds) and bounds[-1] == float("inf")
        assert h["buckets"][-1][1] == h["count"], "buckets are cumulative"
        assert h["sum"] >= 0


def test_renewals_and_a_loss_are_counted(manager: LockManager, node: RedisNode) -> None:
    prefix = _prefix()
    key = f"{prefix}:job-2"
    lock = manager.acquire(key, ttl=1.5)
    _until("a watchdog renewal", lambda: _counts(prefix).get("renewals", 0) >= 1)
    # The key deleted behind the holder's back: the next renewal finds the token gone.
    assert node.client().delete(key) == 1
    _until("the loss", lambda: lock.lost)
    assert _counts(prefix)["losses"] == {"token_gone": 1}
    assert lock.release() is False  # no node held it any more


def test_prometheus_text_parses_and_agrees_with_the_snapshot(manager: LockManager) -> None:
    prefix = _prefix()
    key = f"{prefix}:job-3"
    held = manager.acquire(key)
    with pytest.raises(NotAcquired):
        manager.acquire(key, wait=0)
    held.release()

    snapshot = ferrolock.metrics()[prefix]
    families = {f.name: f for f in text_string_to_metric_families(ferrolock.prometheus_text())}
    assert all(name.startswith("ferrolock_") for name in families)

    def sample(family: str, name: str, **labels: str) -> float:
        for s in families[family].samples:
            if s.name == name and s.labels == {"prefix": prefix, **labels}:
                return s.value
        raise AssertionError(f"no {name} {labels} for {prefix}")

    assert families["ferrolock_grants"].type == "counter"
    assert sample("ferrolock_grants", "ferrolock_grants_total") == snapshot["grants"] == 1
    assert sample("ferrolock_acquire_attempts", "ferrolock_acquire_attempts_total") == snapshot["attempts"]
    assert (
        sample("ferrolock_acquire_failures", "ferrolock_acquire_failures_total", code="NOT_ACQUIRED")
        == snapshot["failures"]["NOT_ACQUIRED"]
        == 1
    )
    assert families["ferrolock_hold_seconds"].type == "histogram"
    assert sample("ferrolock_hold_seconds", "ferrolock_hold_seconds_count") == snapshot["hold"]["count"] == 1
    assert sample("ferrolock_wait_seconds", "ferrolock_wait_seconds_bucket", le="+Inf") == 1


def test_an_acquire_given_up_by_asyncio_wait_for_is_a_cancelled_failure(manager: LockManager) -> None:
    # A caller's deadline (`asyncio.wait_for`) ends a waiting acquire: a failed acquire,
    # counted once under CANCELLED, not only its attempts.
    import asyncio

    prefix = _prefix()
    key = f"{prefix}:job-4"
    held = manager.acquire(key)

    async def main() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(manager.acquire_async(key, wait=SAFETY), 0.5)

    asyncio.run(main())
    held.release()
    m = _counts(prefix)
    assert m["grants"] == 1
    assert m["attempts"] >= 2
    assert m["failures"] == {"CANCELLED": 1}, m
