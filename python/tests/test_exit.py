"""Interpreter exit with locks still held does not hang, and releases them."""

from __future__ import annotations

import time

from conftest import Child, RedisNode

HOLDER = r"""
import asyncio, sys, threading, time, ferrolock
url, key = sys.argv[1], sys.argv[2]
m = ferrolock.LockManager([url], ttl=30)
held = m.acquire(key + ":explicit")

def in_with():
    with ferrolock.redlock(key + ":with", nodes=[url], ttl=30):
        time.sleep(1000)

threading.Thread(target=in_with, daemon=True).start()

def waiting():
    # blocked in an acquire that will never succeed while the process exits
    m.acquire(key + ":explicit")

threading.Thread(target=waiting, daemon=True).start()

async def async_holder():
    lock = await m.acquire_async(key + ":async")
    return lock

keep = asyncio.run(async_holder())
time.sleep(0.3)
print("holding", flush=True)
"""


def test_exit_with_held_locks_does_not_hang_and_releases(node: RedisNode, key: str) -> None:
    child = Child(HOLDER, node.url, key)
    try:
        child.expect("holding")
        t = time.monotonic()
        assert child.wait(15) == 0, "".join(child.err)
        assert time.monotonic() - t < 10
        r = node.client()
        for suffix in (":explicit", ":with", ":async"):
            assert not r.exists(key + suffix), suffix
    finally:
        child.kill()


def test_exit_from_inside_a_with_block(node: RedisNode, key: str) -> None:
    code = r"""
import sys, ferrolock
with ferrolock.redlock(sys.argv[2], nodes=[sys.argv[1]], ttl=30):
    print("inside", flush=True)
    sys.exit(3)
"""
    child = Child(code, node.url, key)
    try:
        child.expect("inside")
        assert child.wait(15) == 3
        assert not node.client().exists(key)
    finally:
        child.kill()


ASYNC_THEN_EXIT = r"""
import asyncio, sys, ferrolock
m = ferrolock.LockManager([sys.argv[1]])

async def main():
    for _ in range(200):
        async with m.lock(sys.argv[2]):
            pass
    lock = await m.acquire_async(sys.argv[2] + ":kept")   # still held at exit
    asyncio.get_running_loop().call_soon(lambda: None)

asyncio.run(main())
print("done", flush=True)
"""


def test_exit_right_after_asyncio_use_never_crashes(node: RedisNode, key: str) -> None:
    """Results handed to the event loop from background threads while the interpreter
    finalizes used to abort the process (a thread re-taking the GIL during finalization is
    ended with pthread_exit, whose unwind through Rust frames aborts)."""
    for _ in range(6):
        child = Child(ASYNC_THEN_EXIT, node.url, key)
        try:
            assert child.wait(30) == 0, "".join(child.err)
        finally:
            child.kill()
    assert not node.client().exists(key + ":kept")
