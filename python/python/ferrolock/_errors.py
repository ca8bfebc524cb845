"""Exceptions of ferrolock: one base, `LockError`, and one subclass per core error kind.

The Rust binding raises these (it imports this module), so every error a caller sees carries
the message, the lock's key (``.key``, None for manager-level errors) and a stable ``.code``
(the same string as the Node binding's ``err.code`` and the C status names).
"""

from __future__ import annotations

import asyncio


class LockError(Exception):
    """Base of every ferrolock error."""

    code: str = "LOCK_ERROR"

    def __init__(self, message: str = "", key: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.key = key

    def __reduce__(self) -> tuple[type[LockError], tuple[str, str | None], dict[str, object]]:
        # Survives pickling (multiprocessing) with its key, and, as any exception does, with
        # the attributes set on it since (its `add_note` notes among them).
        return (type(self), (self.message, self.key), self.__dict__)


class InvalidArgument(LockError, ValueError, TypeError):
    """Bad input: empty key, ttl 0/negative/NaN, wrong type, malformed URL, unknown option.

    Also a ``ValueError`` and a ``TypeError``, so code written for either catches it.
    """

    code = "INVALID_ARGUMENT"


class NotAcquired(LockError):
    """The lock is held by another owner and the ``wait`` budget ran out (or ``wait=0``)."""

    code = "NOT_ACQUIRED"


class NotHeld(LockError):
    """The operation needs a held lock, but this handle no longer holds it."""

    code = "NOT_HELD"


class LockLost(LockError):
    """A held lock could not be kept (the watchdog could not renew it on a quorum in time,
    ``max_hold`` was reached, or the key was deleted or taken)."""

    code = "LOCK_LOST"


class QuorumUnreachable(LockError):
    """Too few nodes answered to form a quorum."""

    code = "QUORUM_UNREACHABLE"


class RedisError(LockError):
    """Redis answered with an error that is none of the above (ACL denial, OOM, ...)."""

    code = "REDIS_ERROR"


CANCELLED_AS: dict[str, type[BaseException]] = {
    "sync": KeyboardInterrupt,
    "async": asyncio.CancelledError,
}
"""The core's ``CANCELLED`` kind has no class of its own: a blocking call interrupted by a
signal raises the signal handler's exception (``KeyboardInterrupt``), a cancelled await raises
``asyncio.CancelledError``."""


class _InjectedLockLost(LockLost):
    """Raised asynchronously into a thread whose ``with`` block lost its lock. The C API
    injects a class, not an instance; ``__exit__`` replaces it with a full ``LockLost``."""

    def __init__(self, message: str = "", key: str | None = None) -> None:
        if not message and key is None:
            # Made by the interpreter, with no arguments, in the thread it was injected into:
            # the binding recorded which lock that was for this thread.
            from ._ferrolock import _injected_loss

            found = _injected_loss()
            if found is not None:
                key, reason = found
                message = f"{reason} (raised inside its `with` block, whose exit raises LockLost too)"
        super().__init__(
            message
            or "the lock of the enclosing `with` block was lost (the block's exit raises LockLost with the key and reason)",
            key,
        )
