"""Every bad input gives a clear InvalidArgument (a LockError, ValueError and TypeError)
naming the option and the value, and never crashes the interpreter."""

from __future__ import annotations

import asyncio
import datetime
import math
import re
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import ferrolock
from ferrolock import InvalidArgument, LockManager, QuorumUnreachable

from conftest import RedisNode

BAD_LOCK_OPTIONS: list[tuple[str, Any, str]] = [
    ("ttl", 0, "ttl=0"),
    ("ttl", 0.0, "ttl=0.0"),
    ("ttl", -1, "ttl=-1"),
    ("ttl", -0.5, "ttl=-0.5"),
    ("ttl", math.nan, "ttl=nan"),
    ("ttl", math.inf, "ttl=inf"),
    ("ttl", 10**400, "ttl="),
    ("ttl", "10", "ttl='10'"),
    ("ttl", b"10", "ttl=b'10'"),
    ("ttl", True, "ttl=True"),
    ("ttl", None, "ttl=None"),
    ("ttl", [10], "ttl=[10]"),
    ("ttl", timedelta(0), "ttl=datetime.timedelta(0)"),
    ("ttl", timedelta(seconds=-1), "ttl=datetime.timedelta"),
    ("ttl", 0.0000001, "the minimum is 100ms"),
    ("ttl", 3e6, "too long"),
    ("wait", -1, "wait=-1"),
    ("wait", math.nan, "wait=nan"),
    ("wait", "forever", "wait='forever'"),
    ("wait", False, "wait=False"),
    ("wait", 10**400, "too long"),  # only a float infinity means "block"
    ("ttl", -(10**400), "must not be negative"),
    ("wait", -(10**400), "must not be negative"),
    ("max_hold", math.inf, "max_hold=inf"),
    ("retry_delay", 0, "retry_delay=0"),
    ("retry_delay", -0.1, "retry_delay=-0.1"),
    ("node_timeout", 0, "node_timeout=0"),
    ("node_timeout", "1s", "node_timeout='1s'"),
    ("max_hold", 0, "max_hold=0"),
    ("max_hold", -3, "max_hold=-3"),
    ("drift_factor", 1.5, "drift_factor=1.5"),
    ("drift_factor", -0.1, "drift_factor=-0.1"),
    ("drift_factor", math.nan, "drift_factor=nan"),
    ("drift_factor", "0.01", "drift_factor='0.01'"),
    ("max_extensions", -1, "max_extensions=-1"),
    ("max_extensions", 1.5, "max_extensions=1.5"),
    ("max_extensions", True, "max_extensions=True"),
    ("max_extensions", 2**40, "max_extensions="),
    ("watchdog", 1, "watchdog=1"),
    ("watchdog", "yes", "watchdog='yes'"),
    ("reentrant", None, "reentrant=None"),
    ("fencing", 0, "fencing=0"),
    ("interrupt", "no", "interrupt='no'"),
    ("tll", 10, '"tll"'),
]


@pytest.mark.parametrize(("name", "value", "shown"), BAD_LOCK_OPTIONS)
def test_bad_lock_option_names_option_value_and_key(
    manager: LockManager, key: str, name: str, value: Any, shown: str
) -> None:
    for call in (
        lambda: manager.acquire(key, **{name: value}),
        lambda: manager.lock(key, **{name: value}),
        lambda: ferrolock.redlock(key, nodes=manager.nodes, **{name: value}),
    ):
        with pytest.raises(InvalidArgument) as info:
            call()
        e = info.value
        assert isinstance(e, ValueError) and isinstance(e, TypeError) and isinstance(e, ferrolock.LockError)
        assert e.code == "INVALID_ARGUMENT"
        assert e.key == key, str(e)
        assert key in str(e), str(e)
        assert shown in str(e), str(e)


@pytest.mark.parametrize(("name", "value", "shown"), BAD_LOCK_OPTIONS)
def test_bad_lock_option_is_named_by_the_async_api_too(
    manager: LockManager, key: str, name: str, value: Any, shown: str
) -> None:
    async def calls() -> None:
        for call in (
            lambda: manager.acquire_async(key, **{name: value}),
            lambda: manager.lock(key, **{name: value}).__aenter__(),
        ):
            with pytest.raises(InvalidArgument) as info:
                await call()
            assert info.value.key == key and shown in str(info.value), str(info.value)

    asyncio.run(calls())


@pytest.mark.parametrize(("name", "value", "shown"), BAD_LOCK_OPTIONS)
def test_bad_lock_option_as_manager_default(node: RedisNode, name: str, value: Any, shown: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        LockManager([node.url], **{name: value})
    assert shown in str(info.value), str(info.value)
    assert info.value.key is None


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        # Range errors: the core's options table (`ManagerOptions::set`), the value as repr().
        ("ttl", 0, "ttl=0: must be greater than zero"),
        ("ttl", timedelta(0), "ttl=datetime.timedelta(0): must be greater than zero"),
        ("ttl", None, 'ttl=None: must be a duration (it has no "none")'),
        ("ttl", 3e6, "ttl=3000000.0: too long: the maximum is 2147483647ms (about 24.8 days)"),
        ("drift_factor", 1.5, "drift_factor=1.5: expected a number in [0, 1)"),
        ("max_extensions", 2**40, "max_extensions=1099511627776: too large (at most 4294967295)"),
        # Type errors: the binding, in the same form, with the Python type.
        ("ttl", "10", "ttl='10' (str): expected a number of seconds or a datetime.timedelta"),
        ("watchdog", 1, "watchdog=1 (int): expected True or False"),
        ("max_extensions", -1, "max_extensions=-1 (int): must not be negative"),
        # Not the zero it would round to.
        ("ttl", 1e-12, "ttl=1e-12 (float): shorter than a nanosecond, the smallest duration"),
    ],
)
def test_option_errors_read_name_equals_value_in_the_cores_words(
    manager: LockManager, key: str, name: str, value: Any, message: str
) -> None:
    with pytest.raises(InvalidArgument) as info:
        manager.acquire(key, **{name: value})
    assert str(info.value) == f'lock "{key}": {message}'


def test_acquire_refuses_a_node_timeout_its_ttl_cannot_renew_with(
    manager: LockManager, key: str
) -> None:
    # Loss margin 2 × 0.45 s, not under a third of 1 s: the lock would be lost at ~0.1 s.
    with pytest.raises(InvalidArgument, match=r"ttl 1s is too short.*node timeout 450ms"):
        manager.acquire(key, ttl=1.0, node_timeout=0.45)
    with pytest.raises(InvalidArgument, match=r"ttl 10ms is too short"):
        manager.acquire(key, ttl=0.01)
    # A context is refused where it is made, not at its `with` (nor a semaphore's: granted,
    # its hold came back already lost).
    with pytest.raises(InvalidArgument, match=r"ttl 1s is too short for lock"):
        manager.lock(key, ttl=1.0, node_timeout=0.45)
    with pytest.raises(InvalidArgument, match=r"ttl 1s is too short for semaphore"):
        manager.semaphore(key, permits=2, ttl=1.0, node_timeout=0.45)
    with pytest.raises(InvalidArgument, match=r"ttl 31s is too long for lock"):
        manager.read_lock(key, ttl=31)
    manager.acquire(key, ttl=1.0).release()


def test_option_names_are_the_cores_table() -> None:
    lock = set(ferrolock._ferrolock.LOCK_OPTIONS)
    manager = set(ferrolock._ferrolock.MANAGER_OPTIONS)
    assert manager == {"nodes", "tls_ca", "restart_guard", "sharded_pubsub"}
    assert "interrupt" in lock and "ttl" in lock and not lock & manager


def test_the_stubs_option_lists_are_the_cores_table() -> None:
    # stubtest checks signatures, not the keys of the TypedDicts that `**options` unpack: a
    # new option, or a renamed one, would leave the stubs behind without a word.
    import ast
    import pathlib

    stub = pathlib.Path(ferrolock.__file__).with_suffix(".pyi")
    fields: dict[str, set[str]] = {}
    for node in ast.parse(stub.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name.endswith("Options"):
            fields[node.name] = {
                item.target.id
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            }
    assert fields["_LockOptions"] == set(ferrolock._ferrolock.LOCK_OPTIONS), stub
    connection = fields["_ConnectionOptions"] | fields["_RedlockOptions"]
    assert connection == set(ferrolock._ferrolock.MANAGER_OPTIONS), stub


@pytest.mark.parametrize(
    ("kwargs", "shown"),
    [
        ({"nodes": []}, "nodes=[]"),
        ({"nodes": ""}, "nodes=''"),
        ({"nodes": [1]}, "nodes=[1]"),
        ({"nodes": 6379}, "nodes=6379"),
        ({"nodes": ["http://127.0.0.1:6379"]}, "http://127.0.0.1:6379"),
        ({"nodes": ["redis://u:hunter2@[bad"]}, "redis://u:***@[bad"),
        ({"nodes": ["redis://u:hun#ter2@127.0.0.1:1"]}, "%23"),
        ({"nodes": ["redis+cluster://u:hun/ter2@127.0.0.1:1"]}, "redis+cluster://u:***@127.0.0.1:1"),
        ({"nodes": ["unix:///tmp/r.sock?pass=hun&ter2=1"]}, "%26"),
        ({"nodes": ["nonsense"]}, "nonsense"),
        # A wrong item beside a URL with a password: the list is shown, the password is not.
        ({"nodes": ["redis://:hunter2@127.0.0.1:1", 5]}, "nodes=['redis://:***@127.0.0.1:1', 5]"),
        ({"nodes": ("redis://:hunter2@h:1", b"redis://:hunter2@h:2")}, "nodes=('redis://:***@h:1', <bytes>)"),
        ({"nodes": {"a": "redis://:hunter2@h:1"}}, "nodes=<dict>"),
        # UTF-8 cannot carry a lone surrogate: named, not a UnicodeEncodeError.
        ({"nodes": ["redis://:hunter2@127.0.0.1:1\ud800"]}, "not valid UTF-8"),
        ({"nodes": "redis://:hunter2@127.0.0.1:1\ud800"}, "not valid UTF-8"),
        ({"nodes": ["redis://:hunter2@127.0.0.1:1/0\x00"]}, "a control character"),
        ({"nodes": ["redis://127.0.0.1:1", ""]}, "empty node URL"),
        ({"tls_ca": 3}, "tls_ca=3"),
        ({"restart_guard": -1}, "restart_guard=-1"),
        ({"restart_guard": "10s"}, "restart_guard='10s'"),
        ({"colour": "red"}, '"colour"'),
    ],
)
def test_bad_manager_option(kwargs: dict[str, Any], shown: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        LockManager(**kwargs)
    assert shown in str(info.value), str(info.value)
    assert "hunter2" not in str(info.value) and "ter2" not in str(info.value)
    with pytest.raises(InvalidArgument):
        ferrolock.redlock("k", **kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"ttl": "redis://:hunter2@127.0.0.1:6379"},
        {"wait": "rediss://user:hunter2@h:6380/0"},
        {"tls_ca": "rediss://:hunter2@h:6380"},
        {"redis://:hunter2@127.0.0.1:6379": 1},
    ],
)
def test_a_node_url_given_to_another_option_is_refused_without_its_password(
    kwargs: dict[str, Any],
) -> None:
    """A URL passed where another option goes (or as an option's name) is named without its
    password, as a node URL always is."""
    with pytest.raises(InvalidArgument) as info:
        LockManager(nodes=["rediss://127.0.0.1:1"], **kwargs)
    assert "hunter2" not in str(info.value), info.value
    assert "***" in str(info.value), info.value



@pytest.mark.parametrize("name", ["retry_delay", "node_timeout", "max_hold", "restart_guard"])
def test_a_duration_under_a_millisecond_is_refused(name: str) -> None:
    # A retry delay of a nanosecond made a waiter send thousands of commands a second; a
    # max_hold that short lost the lock as it was granted; a guard that short was off.
    with pytest.raises(InvalidArgument, match=rf"{name} 500ns is too short: the minimum is 1ms"):
        LockManager(["redis://127.0.0.1:1"], **{name: 5e-7})
    LockManager(["redis://127.0.0.1:1"], **{name: 0.001})


def test_unreadable_tls_ca_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "missing-ca.pem"
    with pytest.raises(InvalidArgument, match="missing-ca.pem"):
        LockManager(["rediss://127.0.0.1:6380"], tls_ca=missing)


@pytest.mark.parametrize("bad_key", ["", 3, None, b"bytes", ["k"], "k\ud800"])
def test_bad_key(manager: LockManager, bad_key: Any) -> None:
    with pytest.raises(InvalidArgument, match="key"):
        manager.acquire(bad_key)
    with pytest.raises(InvalidArgument, match="key"):
        manager.lock(bad_key)
    with pytest.raises(InvalidArgument, match="key"):
        ferrolock.redlock(bad_key, nodes=manager.nodes)


def test_a_lone_surrogate_in_a_key_is_named_not_an_encoding_error(manager: LockManager) -> None:
    # UTF-8 cannot carry it: sent altered, "k\ud800" and "k\udc00" would be one lock.
    with pytest.raises(InvalidArgument, match=r"'k\\ud800' is not valid Unicode"):
        manager.acquire("k\ud800")


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, -1e30, 3e9, "x", True, 10**400, [1]])
def test_bad_release_all_timeout_is_named(manager: LockManager, key: str, bad: object) -> None:
    with manager.lock(key):
        with pytest.raises(InvalidArgument, match=re.escape(f"release_all timeout={bad!r} ({type(bad).__name__}):")):
            manager.release_all(bad)  # type: ignore[arg-type]
    assert manager.release_all(0) == 0
    assert manager.release_all(1) == 0


def test_release_all_takes_a_timedelta_as_every_duration(manager: LockManager, key: str) -> None:
    lock = manager.acquire(key)
    assert manager.release_all(datetime.timedelta(seconds=2)) == 1
    assert lock.lost  # declared lost first, as release_all does to any held lock
    with pytest.raises(InvalidArgument, match=re.escape("release_all timeout=datetime.timedelta(days=-1")):
        manager.release_all(datetime.timedelta(seconds=-1))


def test_lock_options_are_refused_per_lock_when_they_belong_to_the_manager(manager: LockManager, key: str) -> None:
    with pytest.raises(InvalidArgument, match="option of the LockManager"):
        manager.acquire(key, nodes=["redis://127.0.0.1:6379"])


def test_bad_extend_ttl(manager: LockManager, key: str) -> None:
    bads: tuple[Any, ...] = (0, -1, math.nan, "5", math.inf, 10**400, 3e6)
    with manager.lock(key) as lock:
        for bad in bads:
            with pytest.raises(InvalidArgument, match="ttl"):
                lock.extend(bad)

    async def extend_async() -> None:
        async with manager.lock(key) as lock:
            for bad in bads:
                with pytest.raises(InvalidArgument, match="ttl"):
                    await lock.extend_async(bad)
            assert lock.locked()

    asyncio.run(extend_async())


def test_unreachable_node_is_quorum_unreachable_quickly(key: str) -> None:
    from conftest import _free_port

    m = LockManager([f"redis://127.0.0.1:{_free_port()}"])
    t = time.monotonic()
    with pytest.raises(QuorumUnreachable) as info:
        m.acquire(key)  # wait=None: must still give up on a dead cluster
    assert time.monotonic() - t < 15  # a failure bound: not giving up would block for ever
    assert info.value.key == key and key in str(info.value)
    with pytest.raises(QuorumUnreachable):
        with m.lock(key, wait=0):
            pass
    m.close()


def test_async_api_without_a_running_loop_is_a_clear_error(manager: LockManager, key: str) -> None:
    with pytest.raises(RuntimeError, match="event loop"):
        manager._manager.acquire_async(key, {}, 1)


def test_exception_codes_are_the_cores_error_table() -> None:
    # One class per core kind, with the core's stable code; CANCELLED is Python's own
    # cancellation (KeyboardInterrupt for a blocking call, CancelledError for an await).
    from ferrolock import _errors

    core = dict(ferrolock._ferrolock.ERROR_CODES)
    classes = {cls.code: cls for cls in ferrolock.LockError.__subclasses__()}
    assert set(classes) | {"CANCELLED"} == set(core)
    assert "CANCELLED" not in classes
    assert set(_errors.CANCELLED_AS.values()) == {KeyboardInterrupt, __import__("asyncio").CancelledError}
    numbers = sorted(core.values())
    assert numbers == list(range(1, len(core) + 1)), "numbers are stable, dense, and never 0"
    for cls in classes.values():
        assert cls.__name__ in ferrolock.__all__


def test_a_closed_manager_names_the_key_it_was_asked_for(node: RedisNode, key: str) -> None:
    m = LockManager([node.url])
    m.close()
    expected = re.escape(f"lock {key!r}: this LockManager is closed").replace("'", '"')
    with pytest.raises(InvalidArgument, match=expected):
        m.acquire(key)
    with pytest.raises(InvalidArgument, match=expected):
        m.lock(key).__enter__()
    with pytest.raises(InvalidArgument, match=expected):
        m.read_lock(key).__enter__()
    semaphore = re.escape(f"semaphore {key!r}: this LockManager is closed").replace("'", '"')
    with pytest.raises(InvalidArgument, match=semaphore):
        m.semaphore(key, 2).__enter__()
    with pytest.raises(InvalidArgument, match=expected):
        asyncio.run(m.acquire_async(key))


def test_every_async_method_raises_its_errors_from_the_await(manager: LockManager, key: str) -> None:
    # As an `async def` does: a call only makes the coroutine. One that raised at the call
    # would escape a `try` around the `await`, and leave the coroutines made beside it in the
    # same expression (`asyncio.gather(work(), lock.extend_async(t))`) never awaited.
    async def calls() -> None:
        async with manager.lock(key) as lock:
            made = [
                lock.extend_async("5"),
                lock.extend_async(-1),
                manager.acquire_async(key, ttl="5"),
            ]
            for coro in made:
                with pytest.raises(InvalidArgument) as info:
                    await coro
                assert info.value.key == key, str(info.value)
            assert lock.locked()

    asyncio.run(calls())
    # Made before any event loop runs, as `asyncio.run(lock.extend_async(...))` does.
    lock = manager.acquire(key)
    coro = lock.extend_async("5")
    with pytest.raises(InvalidArgument, match="ttl='5'"):
        asyncio.run(coro)
    assert lock.release()


def test_an_unknown_option_lists_every_option_the_call_takes(node: RedisNode, manager: LockManager, key: str) -> None:
    # A misspelt option is answered with the list of those the call takes: the connection
    # options for `redlock()` and its siblings (which take them), `permits` and `count` for a
    # semaphore. Left out, a user who misspelt `nodes` read that no such option exists.
    def valid(call: Any) -> list[str]:
        with pytest.raises(InvalidArgument) as info:
            call()
        assert info.value.key == key, str(info.value)
        return str(info.value).split("valid options: ")[1].split(", ")

    for call in (
        lambda: ferrolock.redlock(key, nodez=[node.url]),
        lambda: ferrolock.read_lock(key, nodez=[node.url]),
        lambda: ferrolock.semaphore(key, 2, nodez=[node.url]),
    ):
        taken = valid(call)
        assert {"nodes", "tls_ca", "restart_guard", "sharded_pubsub", "ttl", "interrupt"} <= set(taken), taken
    for call in (
        lambda: manager.semaphore(key, 2, counts=2),
        lambda: ferrolock.semaphore(key, 2, nodes=[node.url], counts=2),
    ):
        assert {"permits", "count", "ttl"} <= set(valid(call))
    # A manager's lock takes no connection option: none is listed.
    assert "nodes" not in valid(lambda: manager.lock(key, nodez=[node.url]))
    assert "count" not in valid(lambda: manager.lock(key, counts=2))


def test_a_long_key_is_shown_by_its_start_and_length(node: RedisNode) -> None:
    # Redis takes keys up to 512 MB: a message repeating a 1 MiB key whole is unreadable in a
    # log, and the core shows such a key by its start and length; the binding's own messages
    # must too. A node timeout a loaded machine does not run out of with a megabyte to send
    # (about 200 ms, the default, on an idle one in a debug build).
    manager = LockManager([node.url], node_timeout=1)
    key = "k" * (1 << 20)
    shown = '"' + "k" * 64 + '…" (1048576 bytes)'
    messages: list[str] = []
    with pytest.raises(InvalidArgument) as bad:
        manager.lock(key, ttl=-1)
    messages.append(str(bad.value))
    ctx = manager.lock(key)
    with ctx:
        with pytest.raises(ferrolock.NotAcquired) as nested:
            manager.acquire(key, wait=2)
        messages.append(str(nested.value))
        with pytest.raises(InvalidArgument) as entered:
            ctx.__enter__()
        messages.append(str(entered.value))
    for message in messages:
        assert len(message) < 1000 and shown in message, message[:300]
    # One UTF-8 cannot carry (a lone surrogate), refused before it reaches the core.
    with pytest.raises(InvalidArgument, match="not valid Unicode") as lone:
        manager.lock(key + "\udc80")
    assert len(str(lone.value)) < 1000 and '"' + "k" * 64 + '…" (' in str(lone.value), str(lone.value)[:300]
    # A short key is shown whole, as ever.
    with pytest.raises(InvalidArgument, match='^lock "short": ttl=-1'):
        manager.lock("short", ttl=-1)
    with pytest.raises(InvalidArgument, match=r"^lock key 'k\\udc80' is not valid Unicode"):
        manager.lock("k\udc80")
    manager.close()
