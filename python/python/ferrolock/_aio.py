"""asyncio glue used by the Rust extension."""

from __future__ import annotations

import asyncio
from typing import TypeVar

T = TypeVar("T")


async def wrap(future: asyncio.Future[T]) -> T:
    """Makes the extension's `asyncio.Future` a coroutine, so `asyncio.create_task()` and
    `TaskGroup.create_task()` accept it like any `async def` method's result. The work has
    already started; cancelling the await cancels the future (and, for an acquire or extend,
    the work)."""
    return await future
