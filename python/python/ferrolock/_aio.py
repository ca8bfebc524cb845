"""asyncio glue used by the Rust extension."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

T = TypeVar("T")


async def wrap(future: asyncio.Future[T]) -> T:
    """Makes the extension's `asyncio.Future` a coroutine, so `asyncio.create_task()` and
    `TaskGroup.create_task()` accept it like any `async def` method's result. The work has
    already started; cancelling the await cancels the future (and, for an extend, the work;
    an acquire goes through `until_undone`)."""
    return await future


async def fail(error: BaseException) -> NoReturn:
    """Raises `error`, found when the call was made, from the await, as an `async def` method
    would: a caller's `try` around the await sees it."""
    raise error


async def later(start: Callable[[], asyncio.Future[T]]) -> T:
    """As `wrap`, for a call made with no event loop running: `start` starts the work and
    returns its future once this coroutine runs, in its loop."""
    return await start()


async def until_undone(future: asyncio.Future[Any], cancel: Callable[[], None]) -> Any:
    """Awaits an acquire's future (already started). Cancelled, it tells the acquire to stop
    (`cancel`) and raises `CancelledError` only once the acquire has ended, having given back
    what it had taken (a lock it got first is released here): nothing of it is left on a node
    that answered, so another client may take the key at once. A second cancel meanwhile
    does not cut this short (each step is bounded by the node timeout)."""
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        cancel()
        await _uncancellable(future)
        if not future.cancelled() and future.exception() is None:
            release = asyncio.ensure_future(future.result().release_async())
            await _uncancellable(release)
            if not release.cancelled():
                release.exception()  # seen: the cancel is what this reports
        raise


async def _uncancellable(future: asyncio.Future[Any]) -> None:
    """Waits for `future` to end, whatever cancels the waiting task meanwhile."""
    while not future.done():
        try:
            await asyncio.wait([future])
        except asyncio.CancelledError:
            continue
