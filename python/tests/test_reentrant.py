"""Reentrant locks: the owner is the thread (sync) or the asyncio task (async)."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from ferrolock import LockManager, NotAcquired

from conftest import RedisNode


def test_same_thread_reenters_other_threads_wait(node: RedisNode, manager: LockManager, key: str) -> None:
    with manager.lock(key, reentrant=True, wait=1) as outer:
        with manager.lock(key, reentrant=True, wait=1) as inner:
            assert inner.token == outer.token
            blocked: list[BaseException] = []

            def other() -> None:
                try:
                    manager.acquire(key, reentrant=True, wait=0)
                except NotAcquired as e:
                    blocked.append(e)

            t = threading.Thread(target=other)
            t.start()
            t.join()
            assert blocked
        assert node.client().exists(key)  # still held by the outer block
    assert not node.client().exists(key)


def test_same_task_reenters_child_tasks_do_not(manager: LockManager, key: str) -> None:
    async def main() -> None:
        async with manager.lock(key, reentrant=True, wait=1):
            async with manager.lock(key, reentrant=True, wait=1):
                pass

            async def child() -> None:
                await manager.acquire_async(key, reentrant=True, wait=0)

            with pytest.raises(NotAcquired):
                await asyncio.gather(child())

    asyncio.run(main())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_does_not_reenter_the_parents_lock(manager: LockManager, key: str) -> None:
    with manager.lock(key, reentrant=True):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                manager.acquire(key, reentrant=True, wait=0)
            except NotAcquired:
                code = 0
            except BaseException:  # noqa: BLE001
                code = 2
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
