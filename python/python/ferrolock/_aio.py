"""asyncio glue used by the Rust extension."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

T = TypeVar("T")

# How long one hold lasts before it is renewed (about 116 days).
_HOLD = 1e7


def keep(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any]) -> None:
    """Holds the extension's `future` until it is done, for as long as `loop` runs, by a timer
    of the loop (renewed). The library thread that settles it holds it only weakly: held
    strongly from there, it kept the task awaiting it alive after its loop was closed (an
    `async with` suspended there kept its lock renewed for ever, an acquire waiting there kept
    its place in the server queue). A loop's close drops its timers, as it drops what waits on
    its sockets: the task is then collected, as one awaiting any other future of that loop is."""
    hold = loop.call_later(_HOLD, keep, loop, future)
    future.add_done_callback(lambda _: hold.cancel())


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
    except GeneratorExit:
        # Closed without a cancel: the task was collected (its loop closed and gone), and
        # cannot await. Nobody will take the lock: the acquire stops, undone in the background.
        cancel()
        raise
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
