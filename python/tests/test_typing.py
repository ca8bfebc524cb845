"""The stubs as a type checker reads a user's code: stubtest (python/test.sh) checks that they
match the module's signatures, not what mypy concludes from them about the code around a
call."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# Code as a user writes it. A context manager whose `__exit__` is declared to return `bool` may
# swallow the body's exception as far as mypy knows, so a `return` inside the block would not
# end the function ("Missing return statement"); ferrolock's exits never swallow one.
USER_CODE = '''
from datetime import timedelta

import ferrolock
from ferrolock import Lock, LockManager


def with_lock(m: LockManager) -> int:
    with m.lock("k", ttl=5, wait=None) as lock:
        lock.extend(5)
        return 1


def with_redlock() -> Lock:
    with ferrolock.redlock("k", nodes=["redis://127.0.0.1:6379"]) as lock:
        return lock


def with_semaphore(m: LockManager) -> int:
    with m.semaphore("s", permits=3, count=2) as lock:
        return lock.owner


def with_handle(m: LockManager) -> float:
    with m.acquire("k") as lock:
        return lock.validity


async def async_with_lock(m: LockManager) -> float:
    async with m.write_lock("k") as lock:
        return await lock.extend_async(timedelta(seconds=3))


def with_manager() -> str:
    with LockManager() as m:
        return m.nodes[0]


async def async_with_manager() -> int:
    async with LockManager() as m:
        return m.quorum
'''


def test_a_return_inside_a_with_block_type_checks(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    (tmp_path / "user.py").write_text(USER_CODE)
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "user.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
