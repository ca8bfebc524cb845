"""ferrolock: distributed locks over Redis (single instance, Redlock, reentrant), with a
watchdog that keeps held locks alive and tells you when one is lost.

    from ferrolock import redlock

    with redlock("orders:1001", ttl=10.0, wait=5.0) as lock:
        ...  # LockLost is raised here if the lock is lost while the block runs

    async with redlock("orders:1001") as lock:
        ...

All lock logic lives in the Rust core (its host layer, ``ferrolock::host``); this package
converts arguments, maps errors, and bridges blocking and asyncio callers to the core.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import logging
import os
import sys
import threading
import weakref
from datetime import timedelta
from types import TracebackType
from typing import Any, Literal

from . import _ferrolock, _owner
from ._errors import (
    InvalidArgument,
    LockError,
    LockLost,
    NotAcquired,
    NotHeld,
    QuorumUnreachable,
    RedisError,
)
from ._ferrolock import Lock, _LockContextBase, _Manager, metrics, prometheus_text

__version__: str = _ferrolock.__version__

__all__ = [
    "InvalidArgument",
    "Lock",
    "LockContext",
    "LockError",
    "LockLost",
    "LockManager",
    "NotAcquired",
    "NotHeld",
    "QuorumUnreachable",
    "RedisError",
    "metrics",
    "prometheus_text",
    "redlock",
    "read_lock",
    "semaphore",
    "write_lock",
]

logger = logging.getLogger("ferrolock")

_MANAGER_OPTIONS: tuple[str, ...] = tuple(_ferrolock.MANAGER_OPTIONS)


class _AsyncUse:
    """State of one `async with` use of a LockContext. Only the context (and so the block's
    frame) holds it strongly; the loss callback reaches it weakly (see `_signal_loss`)."""

    __slots__ = ("lock", "task", "loop", "interrupt", "cancelling", "in_body", "reason", "cancelled", "__weakref__")

    def __init__(self, interrupt: bool) -> None:
        self.lock: Lock | None = None
        self.task: asyncio.Task[Any] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.interrupt = interrupt
        self.cancelling = 0
        self.in_body = False
        self.reason: str | None = None
        self.cancelled = False


def _signal_loss(use_ref: weakref.ReferenceType[_AsyncUse], reason: str) -> None:
    # From a background thread, with the GIL. The core lock keeps this callback where Python's
    # garbage collector cannot see it, so it holds the block's state weakly: held strongly, the
    # state would keep its task, and the task the lock, alive for ever once the task is
    # abandoned (its loop closed, or a dropped task awaiting what never comes), the lock renewed
    # all the while.
    use = use_ref()
    if use is None or use.loop is None:
        return  # the block is gone
    try:
        use.loop.call_soon_threadsafe(_lost_in_body, use, reason)
    except RuntimeError:
        pass  # the loop is closed: nobody is in the block any more


def _lost_in_body(use: _AsyncUse, reason: str) -> None:
    # On the event loop. The core has logged the loss.
    if use.reason is None:
        use.reason = reason
    if use.in_body and use.interrupt and not use.cancelled and use.task is not None and not use.task.done():
        use.cancelled = True
        use.task.cancel(f"ferrolock: {reason}")


class LockContext(_LockContextBase):
    """``with`` / ``async with`` a lock; made by :func:`redlock` and :meth:`LockManager.lock`.

    Acquires on entry (blocking or awaiting, per ``wait``), releases on exit, and returns the
    :class:`Lock`. If the lock is lost while the body runs:

    - ``with``: ``LockLost`` is raised inside the body, in the thread that entered, at its next
      bytecode boundary, naming the lost lock (unless ``interrupt=False``); a blocking C call (``time.sleep``, a
      socket read, a long C extension call) is not interrupted, the exception arrives when it
      returns. The block's exit raises ``LockLost`` (key and reason) either way.
    - ``async with``: the body is cancelled (unless ``interrupt=False``) and ``LockLost`` is
      raised out of the block; the task's cancellation count is restored (``Task.uncancel``),
      so it does not leak into an enclosing ``asyncio.timeout`` or TaskGroup.

    A context can be reused after it exits, but not entered twice at once.
    """

    _ause: _AsyncUse | None = None

    @property
    def lock(self) -> Lock | None:
        """The held lock while inside the block (``with`` or ``async with``), else None."""
        use = self._ause
        if use is not None and use.in_body:
            return use.lock
        return super().lock

    async def __aenter__(self) -> Lock:
        # Not while entered by `with` either (the Rust half refuses the other way round).
        if self._ause is not None or self._entered:
            self._in_use()
        use = self._ause = _AsyncUse(self.interrupt)
        try:
            lock = await self._acquire_async(_owner.task_owner())
        except BaseException:
            self._ause = None
            raise
        task = asyncio.current_task()
        self._async_body(lock, _owner.task_owner())
        use.lock, use.task, use.loop = lock, task, asyncio.get_running_loop()
        use.cancelling = task.cancelling() if task is not None else 0
        use.in_body = True
        lock._notify_lost(functools.partial(_signal_loss, weakref.ref(use)))
        return lock

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        # Literal[False], not bool: the block never swallows its body's exception, and a type
        # checker told it might would find a `return` inside the block not to end the function.
        use, self._ause = self._ause, None
        self._async_body(None, 0)
        if use is None or use.lock is None:
            return False
        use.in_body = False
        lock = use.lock
        if exc_type is not None and issubclass(exc_type, GeneratorExit):
            # The coroutine is being closed (its task was collected, or its loop closed): it
            # cannot await, so the release runs in the background.
            lock._abandon()
            return False
        ours = False
        if use.cancelled and use.task is not None:
            remaining = use.task.uncancel()
            ours = isinstance(exc, asyncio.CancelledError) and remaining <= use.cancelling
        # The same decision and messages as `with` (the core's host::scope). If this await is
        # cancelled, the release still completes in the background.
        return await self._end_async(lock, ours, exc)




class LockManager:
    """Hands out locks on one set of nodes; connections are opened lazily and shared by every
    lock (and thread, and task) of the manager. One node is a single-instance lock, N nodes
    are Redlock (quorum N/2+1).

    ``nodes`` is a list (or any other sequence: a tuple, a deque) of URLs (``redis://``,
    ``rediss://``, ``unix://``, ``redis+cluster://``, ``rediss+cluster://``) or one
    comma-separated string (not bytes); left out, ``FERROLOCK_NODES``, else ``redis://127.0.0.1:6379``.
    Other keyword options (``tls_ca``, ``restart_guard``, ``sharded_pubsub``, and any lock option such as ``ttl``
    or ``wait``) set this manager's defaults; every lock may override the lock options.
    Durations are seconds (int/float) or ``datetime.timedelta``.
    """

    def __init__(self, nodes: Any = None, **options: Any) -> None:
        self._manager = _Manager(nodes, options)

    def lock(self, key: str, **options: Any) -> LockContext:
        """A context manager for ``with`` and ``async with`` (see :class:`LockContext`)."""
        return LockContext(self._manager, key, options)

    def read_lock(self, key: str, **options: Any) -> LockContext:
        """The read side of the read-write lock ``key``, for ``with`` and ``async with``:
        any number of readers hold it together, never beside a writer. The same options as
        :meth:`lock`, but ``ttl`` is at most 30 s and ``fencing`` is refused (readers get no
        fence). The owner (the thread, or the task under ``async with``) re-enters, also under
        its own write lock (a downgrade)."""
        return LockContext(self._manager, key, options, "read")

    def write_lock(self, key: str, **options: Any) -> LockContext:
        """The write side of the read-write lock ``key``: held alone. The same options as
        :meth:`lock`; with ``fencing`` every grant carries a fence. An owner holding only the
        read lock is refused with :class:`InvalidArgument` (a read->write upgrade: two
        upgraders would wait for each other forever)."""
        return LockContext(self._manager, key, options, "write")

    def semaphore(self, name: str, permits: int, count: int = 1, **options: Any) -> LockContext:
        """``count`` permits of the semaphore ``name``, a pool of ``permits``, for ``with`` and
        ``async with``: at most ``permits`` permits are held at once. The pool size is set by
        the first holder; a different ``permits`` later is refused naming both sizes. Each
        permit is leased for ``ttl`` and renewed by the watchdog like a lock (a crashed
        holder's permits return to the pool when the lease ends); the exit returns exactly what
        this holder took. A semaphore lives on one node: a manager with several nodes is
        refused. Not reentrant (each entry is a holder of its own; inside this thread's own
        blocks of it that leave fewer permits than ``count``, ``NotAcquired`` at once: they
        return theirs only after it): ``reentrant=True`` is refused (a manager's default is
        ignored), as is ``fencing``."""
        return LockContext(self._manager, name, options, "semaphore", permits, count)

    def acquire(self, key: str, **options: Any) -> Lock:
        """Acquires and returns the lock; raises ``NotAcquired`` when ``wait`` runs out
        (``wait=0`` tries once). Blocks with the GIL released; Ctrl-C interrupts the wait.
        The reentrancy owner is the calling thread."""
        return self._manager.acquire(key, options, _owner.thread_owner())

    async def acquire_async(self, key: str, **options: Any) -> Lock:
        """As :meth:`acquire`, awaiting instead of blocking; cancelling the await abandons the
        attempt, and ``CancelledError`` is raised once whatever it had taken (the key, a queue
        entry) is given back on every node that answered. The reentrancy owner is the current
        task."""
        return await self._manager.acquire_async(key, options, _owner.task_owner())  # type: ignore[no-any-return]

    @property
    def nodes(self) -> list[str]:
        """The node URLs, passwords redacted."""
        return self._manager.nodes

    @property
    def quorum(self) -> int:
        """How many nodes must grant a lock: a majority of :attr:`nodes`."""
        return self._manager.quorum

    @property
    def defaults(self) -> dict[str, Any]:
        """The lock options in force for this manager (seconds as float). ``wait`` is None
        when acquires wait without limit, ``node_timeout`` when it is derived from each lock's
        ttl (min(0.2, ttl/10)), ``max_hold`` and ``max_extensions`` when there is no cap."""
        return self._manager.defaults()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run: acquires then raise ``InvalidArgument``."""
        return self._manager.closed

    def release_all(self, timeout: float | timedelta = 5.0) -> int:
        """Releases every lock of this manager that this process has not released, including
        lost ones (a loss deletes nothing: their token may still stand on some nodes); returns
        how many were still held on a quorum. Also tells at once the next waiter of a key this
        manager was looping on (its last release was quiet: docs/reentrancy-and-waiters.md),
        which would otherwise take over a few ms later. A lock still held is declared lost
        first (its ``status`` reads ``"lost"``): a ``with`` block still running on it in another
        thread gets ``LockLost``, as for any loss. ``close()`` and interpreter exit call it
        (exit without declaring anything lost)."""
        return self._manager.release_all(timeout)

    def close(self) -> None:
        """Ends the acquires waiting on this manager (``NotAcquired``, "its manager
        was closed"; nothing of them is left on any node that answers), releases the locks
        still held (see :meth:`release_all`) and closes the connections. Later acquires raise
        ``InvalidArgument``. Idempotent. From a signal handler that interrupted a blocking
        acquire of this manager on its thread, it returns once the manager is closed, and that
        acquire raises ``NotAcquired`` once the close is done (an interrupted ``extend()`` or
        ``release()`` of one of its locks returns once the close is done)."""
        self._manager.close()

    def __enter__(self) -> LockManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> LockManager:
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            closing = asyncio.get_running_loop().run_in_executor(None, self.close)
        except RuntimeError:
            # At interpreter exit (an `atexit` handler) no executor thread can start: close
            # here, blocking the loop for at most close()'s own limit.
            self.close()
            return
        await closing

    def __repr__(self) -> str:
        return repr(self._manager)


def redlock(key: str, **options: Any) -> LockContext:
    """``with redlock(key, **options) as lock:`` (or ``async with``).

    Connection options (``nodes``, ``tls_ca``, ``restart_guard``, ``sharded_pubsub``) pick a manager shared by
    every ``redlock()`` call with the same ones, so a loop does not open new connections; the
    other options (``ttl``, ``wait``, ``reentrant``, ``fencing``, ``watchdog``, ``max_hold``,
    ``max_extensions``, ``retry_delay``, ``drift_factor``, ``node_timeout``, ``interrupt``)
    apply to this lock.
    """
    return _shared_context(key, options, "lock")


def read_lock(key: str, **options: Any) -> LockContext:
    """As :func:`redlock`, for the read side of the read-write lock ``key``
    (see :meth:`LockManager.read_lock`)."""
    return _shared_context(key, options, "read")


def write_lock(key: str, **options: Any) -> LockContext:
    """As :func:`redlock`, for the write side of the read-write lock ``key``
    (see :meth:`LockManager.write_lock`)."""
    return _shared_context(key, options, "write")


def semaphore(name: str, permits: int, count: int = 1, **options: Any) -> LockContext:
    """As :func:`redlock`, for ``count`` permits of the semaphore ``name``, a pool of
    ``permits`` (see :meth:`LockManager.semaphore`)."""
    return _shared_context(name, options, "semaphore", permits, count)


def _shared_context(key: str, options: dict[str, Any], kind: str, permits: Any = None, count: Any = None) -> LockContext:
    conn = {name: options.pop(name) for name in _MANAGER_OPTIONS if name in options}
    return LockContext(_Manager.shared(conn), key, options, kind, permits, count, True)


def _at_exit() -> None:
    # The core's exit protocol (bounded in time): waiting acquires give up, what is still held
    # or lost is released, then no background thread attaches to the finalizing interpreter.
    # Whatever could not be released expires with its ttl.
    _ferrolock._exit()


atexit.register(_at_exit)


# A multiprocessing child started by fork or forkserver ends through os._exit once its target
# returns: `atexit` does not run there, multiprocessing's finalizers do. Its start clears the
# finalizers it inherited, then runs the after-fork callbacks, so ferrolock asks for one that
# registers its exit as the last finalizer of each such child. Asked for at the first fork
# (or import) that finds multiprocessing loaded; the request is inherited by later children.
class _MultiprocessingExit:
    pass


_MP_EXIT = _MultiprocessingExit()  # the after-fork registry holds it weakly
_mp_exit_armed = False


def _exit_multiprocessing_child() -> None:
    # As at interpreter exit, the child's other non-daemon threads end first (its
    # threading._shutdown would join them only after the finalizers). threading's own exit
    # does it: its exit callbacks first (a ThreadPoolExecutor's, which tell its workers to
    # stop; joined without them, an executor left open hung the child for ever), then the
    # joins; the child's own call of it afterwards then returns at once.
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None and threading.current_thread() is threading.main_thread():
        shutdown()
    else:
        current = threading.current_thread()
        for thread in threading.enumerate():
            if thread is not current and not thread.daemon:
                thread.join()
    _at_exit()


def _register_multiprocessing_exit(_: object = None) -> None:
    util = sys.modules["multiprocessing.util"]
    util.Finalize(None, _exit_multiprocessing_child, exitpriority=-(2**31))


def _arm_multiprocessing_exit() -> None:
    global _mp_exit_armed
    util = sys.modules.get("multiprocessing.util")
    if util is None or _mp_exit_armed:
        return
    _mp_exit_armed = True
    util.register_after_fork(_MP_EXIT, _register_multiprocessing_exit)
    process = sys.modules.get("multiprocessing.process")
    if process is not None and process.parent_process() is not None:
        # Imported inside a child already started (the target imports ferrolock).
        _register_multiprocessing_exit()


_arm_multiprocessing_exit()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_arm_multiprocessing_exit)
