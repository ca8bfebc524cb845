"""Ctrl-C while waiting for a lock: KeyboardInterrupt arrives promptly and the interrupted
acquire leaves nothing behind; Ctrl-C while holding one in a `with` block releases it."""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from pathlib import Path

import pytest

import ferrolock
from ferrolock import LockManager, NotAcquired

from conftest import Child, RedisNode

WAITER = r"""
import signal, sys, time, ferrolock
# A child of a background job (`make test &`, a CI step run without job control) inherits
# SIGINT ignored, and Python then installs no handler: restore Ctrl-C's usual meaning.
signal.signal(signal.SIGINT, signal.default_int_handler)
urls = sys.argv[1].split(",")
# ttl 10 × node timeout: its loss margin (2 × node timeout) must be under ttl/3.
m = ferrolock.LockManager(
    urls, ttl=10 * float(sys.argv[3]), node_timeout=float(sys.argv[3]), restart_guard=0
)
print("waiting", flush=True)
t = time.monotonic()
try:
    m.acquire(sys.argv[2])
    print("acquired?!", flush=True)
except KeyboardInterrupt:
    print("interrupted %.3f" % (time.monotonic() - t), flush=True)
    # An attempt in flight finishes (up to node_timeout) before its undo runs: stay alive
    # that long (a process that exits at once leaves the key to its ttl).
    time.sleep(float(sys.argv[3]) + 1.0)
    sys.exit(42)
"""


def _run_waiter(urls: list[str], key: str, node_timeout: float) -> Child:
    return Child(WAITER, ",".join(urls), key, str(node_timeout))


def test_ctrl_c_interrupts_a_blocked_acquire(node: RedisNode, key: str) -> None:
    r = node.client()
    r.set(key, "someone-else", px=60_000)
    child = _run_waiter([node.url], key, 0.2)
    try:
        child.expect("waiting")
        time.sleep(0.5)
        sent = time.monotonic()
        child.proc.send_signal(signal.SIGINT)
        child.expect_prefix("interrupted", timeout=10)
        elapsed = time.monotonic() - sent
        # Far below the 60 s the wait would otherwise last (the key's ttl), not a speed claim.
        assert elapsed < 10.0, elapsed
        assert child.wait(15) == 42, child.err
        assert r.get(key) == "someone-else"
    finally:
        child.kill()


@pytest.mark.serial
def test_ctrl_c_mid_attempt_releases_what_it_had_taken(cluster: list[RedisNode], key: str) -> None:
    """Two of three nodes hold a foreign token and are paused, so each attempt of the waiter
    holds the third node while it waits (node_timeout=3s) for the paused ones. SIGINT lands
    inside such an attempt; the third node must not keep the waiter's token."""
    a, b, c = cluster
    for n in (a, b):
        n.client().set(key, "someone-else", px=60_000)
    child = _run_waiter([n.url for n in cluster], key, 3.0)
    try:
        child.expect("waiting")
        a.pause()
        b.pause()
        deadline = time.monotonic() + 5
        while not c.client().exists(key) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert c.client().exists(key), "the waiter never took the free node"
        sent = time.monotonic()
        child.proc.send_signal(signal.SIGINT)
        child.expect_prefix("interrupted", timeout=10)
        assert time.monotonic() - sent < 2.0
        assert child.wait(15) == 42, "".join(child.err)
        assert not c.client().exists(key), "the interrupted attempt left its token on a node"
    finally:
        child.kill()
        a.resume()
        b.resume()


HOLDER_CTRL_C = r"""
import os, signal, sys, time, redis, ferrolock
signal.signal(signal.SIGINT, signal.default_int_handler)  # see WAITER
url, key, go = sys.argv[1], sys.argv[2], sys.argv[3]
r = redis.Redis.from_url(url, decode_responses=True)
m = ferrolock.LockManager([url], ttl=30)
try:
    with m.lock(key) as lock:
        print("holding", lock.token, flush=True)
        time.sleep(1000)
    print("the body ran to its end?!", flush=True)
except KeyboardInterrupt:
    # Read here, before any exit hook: the block's own exit must have released the key.
    print("interrupted; key exists:", r.exists(key), flush=True)
    while not os.path.exists(go):
        time.sleep(0.01)
    raise
"""


def test_ctrl_c_inside_a_held_with_block_releases_and_propagates(node: RedisNode, key: str, tmp_path: Path) -> None:
    go = tmp_path / "go"
    child = Child(HOLDER_CTRL_C, node.url, key, str(go))
    try:
        token = child.expect_prefix("holding").split()[1]
        r = node.client()
        assert r.get(key) == token  # held (30 s ttl) when the signal lands
        child.proc.send_signal(signal.SIGINT)
        child.expect("interrupted; key exists: 0")
        assert not r.exists(key)
        go.touch()
        # The re-raised KeyboardInterrupt ends Python the way Ctrl-C does: killed by SIGINT.
        assert child.wait(20) == -signal.SIGINT, "".join(child.err)
        assert "KeyboardInterrupt" in "".join(child.err)
        assert not r.exists(key)
    finally:
        child.kill()


def _queue_keys(node: RedisNode, key: str) -> list[str]:
    """The key's queue keys on node (DESIGN.md, "Waiter queue")."""
    return sorted(node.client().scan_iter(match=f"ferrolock:queue*:{{{key}}}"))


def _interrupt_then_release(node: RedisNode, key: str, main: int, held: ferrolock.Lock) -> None:
    """Once a waiter is queued on `key`, signals the main thread (SIGALRM, whose handler raises
    KeyboardInterrupt as Ctrl-C's does), then releases `held`: the waiter is granted just after
    the signal."""
    deadline = time.monotonic() + 30
    while not _queue_keys(node, key) and time.monotonic() < deadline:
        time.sleep(0.005)
    signal.pthread_kill(main, signal.SIGALRM)
    held.release()


def test_ctrl_c_as_the_lock_is_granted_is_raised_not_lost(node: RedisNode, key: str) -> None:
    """Ctrl-C pressed just before a waiting `with` gets its lock (the holder releases right
    after it): its handler ran once the acquire had returned, inside the block's entry, whose
    own Python call swallowed the KeyboardInterrupt, and the body ran as if no Ctrl-C had
    come. It must be raised (by the acquire, or at the body's first bytecode: the exit then
    releases) and leave nothing held or queued."""
    r = node.client()
    holder = LockManager([node.url], ttl=60)
    m = LockManager([node.url], ttl=60)
    main = threading.get_ident()
    ran: list[int] = []

    def handler(*_: object) -> None:
        ran.append(1)
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, handler)
    try:
        for attempt in range(5):
            ran.clear()
            held = holder.acquire(key)
            releaser = threading.Thread(target=_interrupt_then_release, args=(node, key, main, held))
            releaser.start()
            body_ran = False
            interrupted = False
            try:
                with m.lock(key):
                    body_ran = True
                    # Bounded by the lock's own lease: the interrupt comes long before.
                    end = time.monotonic() + 5
                    while time.monotonic() < end:
                        pass
            except KeyboardInterrupt:
                interrupted = True
            releaser.join()
            assert ran, f"attempt {attempt}: the signal handler never ran"
            assert interrupted, f"attempt {attempt}: the handler raised KeyboardInterrupt, lost (body ran: {body_ran})"
            assert not r.exists(key) and _queue_keys(node, key) == [], attempt
    finally:
        signal.signal(signal.SIGALRM, old)
        holder.close()
        m.close()


def test_close_from_a_signal_handler_inside_a_blocked_acquire_does_not_wait_for_it(node: RedisNode, key: str) -> None:
    """A common shutdown: a signal handler closes the manager. Python runs the handler on the
    main thread *inside* its blocked acquire; close() waits for the acquires in progress, one
    of which is that very one, which cannot go on before the handler returns: close() sat out
    its whole 5 s limit (found by a review). It returns once the manager is closed; the
    acquire then ends with NotAcquired ("closed"), raised once the close is done."""
    r = node.client()
    holder = LockManager([node.url], ttl=60)
    held = holder.acquire(key)
    m = LockManager([node.url])
    other = m.acquire(key + ":other")  # a lock of the manager, which close() releases
    seen: dict[str, object] = {}
    give_up = time.monotonic() + 30

    def handler(*_: object) -> None:
        if not _queue_keys(node, key) and time.monotonic() < give_up:
            signal.setitimer(signal.ITIMER_REAL, 0.05)  # the acquire is not waiting yet
            return
        seen["queued"] = bool(_queue_keys(node, key))
        m.close()
        # Observed while this thread's acquire is still in progress (the handler runs inside
        # it): a close that waited for it would by now have run out its limit and released
        # `other`. This one has only closed the manager.
        seen["closed"] = m.closed
        seen["other's key when close() returned"] = r.get(key + ":other")

    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(NotAcquired, match="closed"):
            m.acquire(key)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    try:
        assert seen["queued"], "the acquire never queued: the signal did not land inside it"
        assert seen["closed"] is True
        assert seen["other's key when close() returned"] == other.token, seen
        # The acquire raised once the close was done: the manager's lock released (its holder
        # told), the ended acquire's queue entry gone, the holder's key untouched.
        assert not r.exists(key + ":other")
        assert other.lost
        assert _queue_keys(node, key) == []
        assert r.get(key) == held.token
        with pytest.raises(ferrolock.InvalidArgument, match="closed"):
            m.acquire(key)
    finally:
        held.release()
        holder.close()


def test_ctrl_c_as_a_blocking_acquire_is_granted_gives_the_lock_back_before_raising(
    node: RedisNode, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """`manager.acquire()` granted just after Ctrl-C: the KeyboardInterrupt came once the
    call had returned, and the `Lock` it returned was dropped with it, released in the
    background with the warning for a handle collected while held ("keep a reference to the
    lock"), advice for a bug the user did not make. The acquire must raise it itself, having
    released what it got."""
    caplog.set_level(logging.WARNING, logger="ferrolock")
    r = node.client()
    holder = LockManager([node.url], ttl=60)
    m = LockManager([node.url], ttl=60)
    main = threading.get_ident()
    ran: list[int] = []

    def handler(*_: object) -> None:
        ran.append(1)
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, handler)
    try:
        for attempt in range(5):
            ran.clear()
            releaser = threading.Thread(
                target=_interrupt_then_release, args=(node, key, main, holder.acquire(key))
            )
            releaser.start()
            try:
                with pytest.raises(KeyboardInterrupt):
                    m.acquire(key)
            finally:
                releaser.join()
            assert ran, f"attempt {attempt}: the signal handler never ran"
            assert not r.exists(key) and _queue_keys(node, key) == [], attempt
        collected = [x.getMessage() for x in caplog.records if "garbage-collected" in x.getMessage()]
        assert not collected, collected
    finally:
        signal.signal(signal.SIGALRM, old)
        holder.close()
        m.close()


def test_ctrl_c_during_the_exits_release_after_a_failed_body_is_raised_not_lost(
    caplog: pytest.LogCaptureFixture, key: str
) -> None:
    """The body raised, and its exit's release waits for a node that does not answer (a
    release is not cut short by Ctrl-C). A Ctrl-C meanwhile had its handler run in the warning
    the exit then logs, whose `logging` call dropped the KeyboardInterrupt: the body's
    exception went on alone, to a caller that may catch it and carry on. The exit must log the
    warning and raise the KeyboardInterrupt."""
    caplog.set_level(logging.WARNING, logger="ferrolock")
    node = RedisNode()
    # The release waits node_timeout (1 s) for the paused node; the signal comes 0.1 s in.
    m = LockManager([node.url], ttl=10, node_timeout=1)
    ran: list[int] = []

    def handler(*_: object) -> None:
        ran.append(1)
        raise KeyboardInterrupt

    class BodyError(Exception):
        pass

    old = signal.signal(signal.SIGALRM, handler)
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            with m.lock(key):
                node.pause()
                signal.setitimer(signal.ITIMER_REAL, 0.1)
                raise BodyError("the body failed")
        assert ran, "the signal handler never ran"
        assert isinstance(info.value.__context__, BodyError)
        # The fault: the release failed (the paused node), and the exit said so.
        assert any("while ending the scope after the body failed" in r.getMessage() for r in caplog.records)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        node.resume()
        m.close()
        node.close()


SAME_LOCK_FROM_A_HANDLER = r"""
import json, os, signal, sys, time, ferrolock
url, key, pid, outer, inner = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
# ttl 60 s, node timeout 5 s: the outer call waits that long for the paused node.
m = ferrolock.LockManager([url], ttl=60, node_timeout=5)
lock = m.acquire(key)
seen = {}
inside = False

def handler(*_):
    if not inside:
        signal.setitimer(signal.ITIMER_REAL, 0.05)  # the outer call has not started yet
        return
    seen["landed inside"] = True
    os.kill(pid, signal.SIGCONT)  # the node answers again: only the handler holds things up
    try:
        seen["inner"] = getattr(lock, inner)()
    except ferrolock.LockError as e:
        seen["inner"] = [type(e).__name__, str(e), e.key]

signal.signal(signal.SIGALRM, handler)
os.kill(pid, signal.SIGSTOP)
call = getattr(lock, outer)  # looked up first: no handler runs between the flag and the call
signal.setitimer(signal.ITIMER_REAL, 0.05)
inside = True
seen["outer"] = call()
inside = False
seen["locked after"] = lock.locked()
if lock.locked():
    seen["released after"] = lock.release()
print(json.dumps(seen), flush=True)
"""


@pytest.mark.serial
@pytest.mark.parametrize("outer, inner", [("extend", "release"), ("release", "release"), ("release", "extend")])
def test_a_handler_calling_the_lock_inside_its_own_extend_or_release_is_refused_not_hung(
    cluster: list[RedisNode], key: str, outer: str, inner: str
) -> None:
    """A signal handler (a SIGTERM handler that releases what it holds) runs on the main thread
    inside its blocking extend() or release() of a lock, and calls that lock again: the second
    call waited for the first, which cannot go on before the handler returns, for ever (found
    by a review). It is refused at once, naming both calls; the first then completes."""
    node = cluster[0]
    assert node.proc is not None
    child = Child(SAME_LOCK_FROM_A_HANDLER, node.url, key, str(node.proc.pid), outer, inner)
    try:
        child.expect_prefix("{", timeout=30)
        seen = json.loads(child.out[-1])
        assert seen["landed inside"], seen
        kind, message, named = seen["inner"]
        assert kind == "InvalidArgument" and named == key, seen
        assert f'lock "{key}": {inner}() was called inside this thread\'s {outer}() of it' in message, message
        if outer == "extend":
            assert seen["outer"] > 0 and seen["locked after"] and seen["released after"] is True, seen
        else:
            assert seen["outer"] is True and not seen["locked after"], seen
        assert not node.client().exists(key)
        assert child.wait(20) == 0, "".join(child.err)
    finally:
        child.kill()
        node.paused = True
        node.resume()


EXIT_FROM_A_HANDLER = r"""
import contextlib, json, os, signal, sys, ferrolock
url, key, pid, made_by = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
m = ferrolock.LockManager([url], ttl=60, node_timeout=5)
stack = contextlib.ExitStack()
lock = stack.enter_context(getattr(m, made_by)(key))
seen = {}
inside = False

def handler(*_):
    if not inside:
        signal.setitimer(signal.ITIMER_REAL, 0.05)  # the extend has not started yet
        return
    seen["landed inside"] = True
    os.kill(pid, signal.SIGCONT)  # the node answers again: only the handler holds things up
    try:
        stack.close()  # a clean-up handler ends every scope it opened
        seen["exit"] = "ran"
    except ferrolock.LockError as e:
        seen["exit"] = [type(e).__name__, str(e), e.key]

signal.signal(signal.SIGALRM, handler)
os.kill(pid, signal.SIGSTOP)
extend = lock.extend  # looked up first: no handler runs between the flag and the call
signal.setitimer(signal.ITIMER_REAL, 0.05)
inside = True
seen["extend"] = extend()
inside = False
seen["locked after"] = lock.locked()
seen["released after"] = lock.release()
print(json.dumps(seen), flush=True)
"""


@pytest.mark.serial
@pytest.mark.parametrize("made_by", ["lock", "acquire"])
def test_a_scopes_exit_run_by_a_handler_inside_its_locks_extend_is_refused_not_hung(
    cluster: list[RedisNode], key: str, made_by: str
) -> None:
    """The same wait from a scope's exit: a clean-up handler closing an ExitStack that holds a
    `manager.lock()` context (or an `acquire()` handle used as one) while the main thread
    extends that lock: the exit's release waited for the extend for ever. Refused at once,
    before the scope is left; the extend completes, and the lock is still held."""
    node = cluster[0]
    assert node.proc is not None
    child = Child(EXIT_FROM_A_HANDLER, node.url, key, str(node.proc.pid), made_by)
    try:
        child.expect_prefix("{", timeout=30)
        seen = json.loads(child.out[-1])
        assert seen["landed inside"], seen
        kind, message, named = seen["exit"]
        assert kind == "InvalidArgument" and named == key, seen
        assert f'lock "{key}": __exit__() was called inside this thread\'s extend() of it' in message, message
        assert seen["extend"] > 0 and seen["locked after"] and seen["released after"] is True, seen
        assert not node.client().exists(key)
        assert child.wait(20) == 0, "".join(child.err)
    finally:
        child.kill()
        node.paused = True
        node.resume()


CLOSE_FROM_A_HANDLER_IN_A_LOCK_CALL = r"""
import json, os, signal, sys, time, redis, ferrolock
url, key, pid, outer = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
r = redis.Redis.from_url(url, decode_responses=True)
# Node timeout 4 s, under close()'s own 5 s limit.
m = ferrolock.LockManager([url], ttl=60, node_timeout=4)
lock = m.acquire(key)
other = m.acquire(key + ":other")  # a lock of the manager that close() releases
seen = {}
inside = False

def handler(*_):
    if not inside:
        signal.setitimer(signal.ITIMER_REAL, 0.05)  # the outer call has not started yet
        return
    seen["landed inside"] = True
    m.close()
    seen["closed"] = m.closed
    # Only now does the node answer again: a close that sat out its limit had its release of
    # `other` time out against it; one that returned at once releases it from here on.
    os.kill(pid, signal.SIGCONT)

signal.signal(signal.SIGALRM, handler)
os.kill(pid, signal.SIGSTOP)
call = getattr(lock, outer)  # looked up first: no handler runs between the flag and the call
signal.setitimer(signal.ITIMER_REAL, 0.05)
inside = True
try:
    seen["outer"] = call()
except ferrolock.LockError as e:
    seen["outer"] = [type(e).__name__, str(e)]
inside = False
# Read as soon as the interrupted call has returned: the close must be done by then.
seen["key after"] = r.exists(key)
seen["other's key after"] = r.exists(key + ":other")
print(json.dumps(seen), flush=True)
"""


@pytest.mark.serial
@pytest.mark.parametrize("outer", ["extend", "release"])
def test_close_from_a_signal_handler_inside_an_extend_or_release_does_not_wait_for_it(
    cluster: list[RedisNode], key: str, outer: str
) -> None:
    """As for an acquire: a handler's close() waits for the lock's release, which waits for the
    extend() or release() the handler interrupted, which cannot go on before the handler
    returns: close() sat out its whole 5 s limit (its release of the manager's other lock, on
    a node still paused, timed out meanwhile) and returned with the lock still held. It
    returns once the manager is closed; the interrupted call ends once the close is done,
    every lock of the manager released."""
    node = cluster[0]
    assert node.proc is not None
    child = Child(CLOSE_FROM_A_HANDLER_IN_A_LOCK_CALL, node.url, key, str(node.proc.pid), outer)
    try:
        child.expect_prefix("{", timeout=30)
        seen = json.loads(child.out[-1])
        assert seen["landed inside"] and seen["closed"] is True, seen
        assert seen["other's key after"] == 0 and seen["key after"] == 0, seen
        assert child.wait(20) == 0, "".join(child.err)
    finally:
        child.kill()
        node.paused = True
        node.resume()
