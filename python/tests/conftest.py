"""Real redis-servers for the Python suite: started on free loopback ports with no
persistence and a temp dir each, stopped by pid. Faults are real: SIGSTOP/SIGCONT, kill."""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import ferrolock

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisNode:
    """One redis-server process."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="ferrolock-py-redis-")
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self, attempts: int = 5) -> None:
        last = ""
        for _ in range(attempts):
            port = self.port or _free_port()
            proc = subprocess.Popen(
                [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", self.dir, "--daemonize", "no"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            )
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    if redis.Redis(port=port, socket_timeout=0.5).ping():
                        self.port, self.proc = port, proc
                        return
                except redis.exceptions.ConnectionError:
                    time.sleep(0.02)
            # Lost a race for the port (or failed to start): try another port.
            proc.kill()
            out = proc.communicate()[0]
            last = out.decode(errors="replace")[-500:]
            if self.port:
                self.port = 0
        raise RuntimeError(f"redis-server did not start: {last}")

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2, decode_responses=True)

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        if self.proc is not None and self.paused:
            self.proc.send_signal(signal.SIGCONT)
            self.paused = False

    def kill(self) -> None:
        if self.proc is not None:
            self.resume()
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def node() -> Iterator[RedisNode]:
    """One server shared by the tests that do not hurt it (each uses its own keys)."""
    n = RedisNode()
    yield n
    n.close()


@pytest.fixture
def cluster() -> Iterator[list[RedisNode]]:
    """Three fresh servers for a test that pauses or kills some."""
    nodes = [RedisNode() for _ in range(3)]
    yield nodes
    for n in nodes:
        n.close()


@pytest.fixture
def key(request: pytest.FixtureRequest) -> str:
    name = re.sub(r"[^A-Za-z0-9_]+", "_", request.node.name)[:60]
    return f"test:{name}:{uuid.uuid4().hex[:8]}"


@pytest.fixture
def manager(node: RedisNode) -> Iterator[ferrolock.LockManager]:
    m = ferrolock.LockManager([node.url])
    yield m
    m.close()


class Child:
    """`python -c code` with this interpreter (so the same ferrolock), its stdout read by a
    thread so a hung child cannot hang the test."""

    def __init__(self, code: str, *args: str, env: dict[str, str] | None = None) -> None:
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=full_env,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.out: list[str] = []
        self.err: list[str] = []
        threading.Thread(target=self._read, args=(self.proc.stdout, self.lines), daemon=True).start()
        self._err_reader = threading.Thread(target=self._read_err, daemon=True)
        self._err_reader.start()

    @staticmethod
    def _read(stream: Any, q: queue.Queue[str | None]) -> None:
        for line in stream:
            q.put(line.rstrip("\n"))
        q.put(None)

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.err.append(line)

    def expect_prefix(self, prefix: str, timeout: float = 20.0) -> str:
        """Waits for a stdout line starting with `prefix` and returns it."""
        self.expect(prefix, timeout, prefix=True)
        return self.out[-1]

    def expect(self, expected: str, timeout: float = 20.0, prefix: bool = False) -> None:
        """Waits for a stdout line equal to `expected`."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = self.lines.get(timeout=max(left, 0.001))
            except queue.Empty:
                line = None
                left = 0
            if line is not None:
                self.out.append(line)
                if line == expected or (prefix and line.startswith(expected)):
                    return
                continue
            self.proc.kill()
            raise AssertionError(
                f"child never printed {expected!r} (timeout {timeout}s or exit {self.proc.poll()}); "
                f"stdout={self.out!r} stderr={''.join(self.err)[-3000:]}"
            )

    def wait(self, timeout: float = 20.0) -> int:
        """Waits for the exit, then for `err` to hold all the child wrote on stderr."""
        try:
            code = self.proc.wait(timeout=timeout)
            self._err_reader.join(timeout)
            return code
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"child did not exit within {timeout}s; stdout={self.out!r} stderr={''.join(self.err)[-3000:]}") from None

    def rest(self) -> list[str]:
        """Remaining stdout lines (after exit)."""
        out = []
        while True:
            try:
                line = self.lines.get(timeout=5)
            except queue.Empty:
                break
            if line is None:
                break
            out.append(line)
        self.out.extend(out)
        return out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def children() -> Iterator[list[Child]]:
    """Children started through this list are killed at teardown."""
    started: list[Child] = []
    yield started
    for c in started:
        c.kill()
