# Public API of ferrolock. Checked against the runtime by `python -m mypy.stubtest ferrolock`.
import asyncio
import logging
import os
from collections.abc import Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any, Literal, TypedDict, Unpack

from ._errors import (
    InvalidArgument as InvalidArgument,
    LockError as LockError,
    LockLost as LockLost,
    NotAcquired as NotAcquired,
    NotHeld as NotHeld,
    QuorumUnreachable as QuorumUnreachable,
    RedisError as RedisError,
)
from ._ferrolock import Lock as Lock, _LockContextBase, _Manager

__version__: str
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

logger: logging.Logger

# Durations: seconds (int or float) or a timedelta.
_Seconds = float | timedelta

class _LockOptions(TypedDict, total=False):
    ttl: _Seconds
    wait: _Seconds | None
    retry_delay: _Seconds
    node_timeout: _Seconds | None
    drift_factor: float
    watchdog: bool
    max_hold: _Seconds | None
    max_extensions: int | None
    reentrant: bool
    fencing: bool
    interrupt: bool

class _ConnectionOptions(_LockOptions, total=False):
    tls_ca: str | os.PathLike[str] | None
    restart_guard: _Seconds | None
    sharded_pubsub: bool

class _RedlockOptions(_ConnectionOptions, total=False):
    nodes: str | Sequence[str] | None

class LockContext(_LockContextBase):
    @property
    def lock(self) -> Lock | None: ...
    async def __aenter__(self) -> Lock: ...
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]: ...

class LockManager:
    def __init__(self, nodes: str | Sequence[str] | None = None, **options: Unpack[_ConnectionOptions]) -> None: ...
    def lock(self, key: str, **options: Unpack[_LockOptions]) -> LockContext: ...
    def read_lock(self, key: str, **options: Unpack[_LockOptions]) -> LockContext: ...
    def write_lock(self, key: str, **options: Unpack[_LockOptions]) -> LockContext: ...
    def semaphore(self, name: str, permits: int, count: int = 1, **options: Unpack[_LockOptions]) -> LockContext: ...
    def acquire(self, key: str, **options: Unpack[_LockOptions]) -> Lock: ...
    async def acquire_async(self, key: str, **options: Unpack[_LockOptions]) -> Lock: ...
    @property
    def nodes(self) -> list[str]: ...
    @property
    def quorum(self) -> int: ...
    @property
    def defaults(self) -> dict[str, Any]: ...
    @property
    def closed(self) -> bool: ...
    def release_all(self, timeout: float | timedelta = 5.0) -> int: ...
    def close(self) -> None: ...
    def __enter__(self) -> LockManager: ...
    def __exit__(self, *exc: object) -> None: ...
    async def __aenter__(self) -> LockManager: ...
    async def __aexit__(self, *exc: object) -> None: ...

def redlock(key: str, **options: Unpack[_RedlockOptions]) -> LockContext: ...
def read_lock(key: str, **options: Unpack[_RedlockOptions]) -> LockContext: ...
def write_lock(key: str, **options: Unpack[_RedlockOptions]) -> LockContext: ...
def semaphore(name: str, permits: int, count: int = 1, **options: Unpack[_RedlockOptions]) -> LockContext: ...

class _Histogram(TypedDict):
    buckets: list[tuple[float, int]]  # (upper bound in seconds, cumulative count); the last is inf
    count: int
    sum: float

class _PrefixMetrics(TypedDict):
    attempts: int
    grants: int
    handoffs: int
    renewals: int
    renewal_failures: int
    failures: dict[str, int]
    losses: dict[str, int]
    wait: _Histogram
    hold: _Histogram

def metrics() -> dict[str, _PrefixMetrics]: ...
def prometheus_text() -> str: ...
