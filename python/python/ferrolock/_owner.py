"""Reentrancy owners: small integers, unique in the process, one per thread (sync code) and
one per asyncio task (async code).

Not a contextvar: child tasks inherit those, so an ``asyncio.gather`` inside a reentrant block
would re-enter the lock concurrently. Not ``threading.get_ident()`` or ``id(task)`` either: both
are reused once a thread or task is gone.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import weakref

_next = itertools.count(1).__next__  # atomic under the GIL
_thread = threading.local()
_tasks: weakref.WeakKeyDictionary[asyncio.Task[object], int] = weakref.WeakKeyDictionary()


class _ThreadToken:
    """Lives as long as its thread: held only by the thread's ``threading.local`` storage,
    which CPython clears when the thread ends. A weak reference to it tells whether a thread
    is still the one it was (its ident is reused by the next thread to start, as a rule)."""

    __slots__ = ("__weakref__",)


def thread_token() -> _ThreadToken:
    """The calling thread's token (see ``_ThreadToken``)."""
    try:
        return _thread.token  # type: ignore[no-any-return]
    except AttributeError:
        token = _thread.token = _ThreadToken()
        return token


def thread_owner() -> int:
    """The owner id of the calling thread."""
    try:
        return _thread.owner  # type: ignore[no-any-return]
    except AttributeError:
        owner = _thread.owner = _next()
        return owner


def task_owner() -> int:
    """The owner id of the running asyncio task (the thread's, outside a task)."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    if task is None:
        return thread_owner()
    owner = _tasks.get(task)
    if owner is None:
        owner = _tasks[task] = _next()
    return owner


def is_current(owner: int) -> bool:
    """Whether the caller is `owner`: its thread, or its asyncio task. Both count inside a
    task, as both take locks there: sync code (`with`, `acquire()`) for the thread, async
    code for the task."""
    return owner == thread_owner() or owner == task_owner()
