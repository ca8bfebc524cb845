"""The fault harness: redis-servers on loopback, the test bed's proxies, client processes, and
a nemesis that logs every fault it injects with its start and end (CLOCK_MONOTONIC).

Servers run with ``--save "" --appendonly no --dir <own temp dir>`` unless a test asks for
persistence. Every fault is checked to have happened before it is logged as started (a
stopped process reads 'T' in /proc, a killed one is gone, a cut link refuses traffic).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
PROXY_BIN = Path(os.environ.get(
    "FAULTS_PROXY_BIN",
    Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "debug" / "testbed-proxy",
))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 1:].split()[0]


def wait_until(what: str, cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting until {what}")
        time.sleep(0.01)


def warmed_up(client, key: str = "warm", timeout: float = 30.0) -> None:
    """Tries ``key`` (one try each, on ``client``'s manager) until granted, then releases it:
    the client is connected and its scripts loaded. A client's first try also connects, within
    the node timeout (a tenth of the ttl, at most 200 ms), which a loaded machine can overrun:
    a test whose point is one try of a connected client warms it up first."""
    deadline = time.monotonic() + timeout
    while True:
        got = client.call(op="acquire", h="warm", key=key, opts={"watchdog": False, "wait": 0.0})
        if got["ok"]:
            break
        assert time.monotonic() < deadline, f"never granted {key}: {got}"
        time.sleep(0.1)
    assert client.call(op="release", h="warm")["ok"]


class Node:
    """One redis-server with its own temp dir and a fixed port across restarts."""

    def __init__(self, name: str, persistence: bool = False) -> None:
        self.name = name
        self.dir = tempfile.mkdtemp(prefix="ferrolock-faults-")
        self.persistence = persistence
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def _args(self, port: int) -> list[str]:
        args = [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--daemonize", "no",
                "--dir", self.dir, "--protected-mode", "no"]
        if self.persistence:
            args += ["--save", "", "--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--save", "", "--appendonly", "no"]
        return args

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=10, decode_responses=True)

    def _answers(self, port: int, pid: int) -> bool:
        try:
            r = redis.Redis(port=port, socket_timeout=0.5, decode_responses=True)
            return r.info("server")["process_id"] == pid and r.ping()
        except (redis.exceptions.RedisError, OSError, KeyError):
            return False

    def start(self) -> None:
        for _ in range(20 if not self.port else 100):
            port = self.port or free_port()
            log = open(os.path.join(self.dir, "redis.log"), "a")
            proc = subprocess.Popen(self._args(port), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and proc.poll() is None:
                if self._answers(port, proc.pid):
                    self.port, self.proc = port, proc
                    return
                time.sleep(0.02)
            proc.kill()
            proc.wait()
            time.sleep(0.1)  # the same port after a restart: wait for it rather than move
        raise RuntimeError(f"redis-server {self.name} did not start; see {self.dir}/redis.log")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        if self.proc is not None:
            pid = self.pid
            os.kill(pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()
            assert proc_state(pid) is None, f"{self.name} pid {pid} survived SIGKILL"
            self.proc = None

    def restart(self, keep_data: bool | None = None) -> None:
        """Kill and start again on the same port; without persistence its data is gone."""
        self.kill()
        if not (self.persistence if keep_data is None else keep_data):
            for f in ("dump.rdb", "appendonlydir"):
                p = os.path.join(self.dir, f)
                shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) else (
                    os.path.exists(p) and os.remove(p))
        self.start()

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)
        wait_until(f"{self.name} is stopped", lambda: proc_state(self.pid) == "T")

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)
        wait_until(f"{self.name} answers after SIGCONT", lambda: self._answers(self.port, self.pid))

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class ProxyHub:
    """The test bed's proxies (tests/testbed/src/bin/testbed-proxy.rs), driven over a pipe."""

    def __init__(self) -> None:
        if not PROXY_BIN.exists():
            raise RuntimeError(f"{PROXY_BIN} missing: cargo build -p ferrolock-testbed --bins")
        self.proc = subprocess.Popen([str(PROXY_BIN)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)
        self._mu = threading.Lock()

    def cmd(self, line: str) -> str:
        with self._mu:
            assert self.proc.stdin and self.proc.stdout
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
            reply = self.proc.stdout.readline().strip()
        if not reply.startswith("ok"):
            raise RuntimeError(f"proxy {line!r}: {reply!r}")
        return reply

    def new(self, target_port: int) -> tuple[int, int]:
        _, pid, port = self.cmd(f"new {target_port}").split()
        return int(pid), int(port)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # type: ignore[union-attr]
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class FaultLog:
    """Every fault, with start and end times; JSON lines next to the history."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._mu = threading.Lock()

    def log(self, **ev) -> None:
        with self._mu, open(self.path, "a") as f:
            f.write(json.dumps(ev, sort_keys=True) + "\n")

    def read(self) -> list[dict]:
        if not os.path.exists(self.path):
            return []
        return [json.loads(x) for x in open(self.path) if x.strip()]


class ClientProc:
    """A client process (client.py) in scenario mode: one JSON command, one JSON answer."""

    def __init__(self, name: str, nodes: list[str], history: str, resource_port: int | None,
                 manager: dict | None = None, extra: dict | None = None) -> None:
        self.name = name
        cfg = {"name": name, "nodes": nodes, "history": history, "resource_port": resource_port,
               "manager": manager or {}}
        cfg.update(extra or {})
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen([sys.executable, str(HERE / "client.py"), json.dumps(cfg)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     bufsize=1, env=env)
        hello = self._read(60)
        assert hello.get("ready"), hello
        self.pid = self.proc.pid

    def _read(self, timeout: float) -> dict:
        assert self.proc.stdout
        out: list[str] = []
        t = threading.Thread(target=lambda: out.append(self.proc.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout)
        if not out or not out[0]:
            raise AssertionError(f"client {self.name} gave no answer within {timeout}s")
        return json.loads(out[0])

    def send(self, **cmd) -> None:
        assert self.proc.stdin
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def answer(self, timeout: float = 60) -> dict:
        return self._read(timeout)

    def call(self, timeout: float = 60, **cmd) -> dict:
        self.send(**cmd)
        return self.answer(timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.pid, signal.SIGCONT)
                self.send(op="exit")
                self.proc.wait(timeout=10)
            except Exception:
                self.proc.kill()
                self.proc.wait()


class Nemesis:
    """Injects faults and logs them: kind, target, start, end. Each is verified as it starts."""

    def __init__(self, faults: FaultLog, hub: ProxyHub | None) -> None:
        self.faults = faults
        self.hub = hub
        self._open: dict[str, dict] = {}

    def _start(self, kind: str, target: str, **extra) -> str:
        fid = f"{kind}:{target}:{len(self._open)}:{time.monotonic()}"
        ev = {"fault": kind, "target": target, "start": time.monotonic(), **extra}
        self._open[fid] = ev
        return fid

    def _end(self, fid: str, t: float | None = None) -> None:
        """``t``: when the fault stopped acting (the SIGCONT sent, the link healed)."""
        ev = self._open.pop(fid)
        ev["end"] = time.monotonic() if t is None else t
        self.faults.log(**ev)

    def _instant(self, kind: str, target: str, t_start: float, **extra) -> None:
        self.faults.log(fault=kind, target=target, start=t_start, end=time.monotonic(), **extra)

    # processes
    def pause_client(self, c: ClientProc) -> str:
        os.kill(c.pid, signal.SIGSTOP)
        wait_until(f"client {c.name} is stopped", lambda: proc_state(c.pid) == "T")
        return self._start("pause_client", c.name, pid=c.pid)

    def resume_client(self, c: ClientProc, fid: str) -> None:
        t = time.monotonic()
        os.kill(c.pid, signal.SIGCONT)
        wait_until(f"client {c.name} runs", lambda: proc_state(c.pid) not in ("T", None))
        self._end(fid, t)

    def kill_client(self, c: ClientProc) -> None:
        """SIGKILL: the client's watchdog dies with it, its holds stay until their leases end."""
        t = time.monotonic()
        c.proc.kill()
        c.proc.wait()
        assert proc_state(c.pid) is None, f"client {c.name} pid {c.pid} survived SIGKILL"
        self._instant("kill_client", c.name, t, pid=c.pid)

    def pause_node(self, n: Node) -> str:
        n.pause()
        return self._start("pause_node", n.name, pid=n.pid)

    def resume_node(self, n: Node, fid: str) -> None:
        t = time.monotonic()
        n.resume()
        self._end(fid, t)

    def kill_node(self, n: Node) -> str:
        n.kill()
        return self._start("kill_node", n.name)

    def start_node(self, n: Node, fid: str) -> None:
        n.start()
        self._end(fid)

    def restart_node(self, n: Node, keep_data: bool = False) -> None:
        t = time.monotonic()
        old = n.pid
        n.restart(keep_data)
        assert n.pid != old
        self._instant("restart_node", n.name, t, keep_data=keep_data, old_pid=old, pid=n.pid)

    # links (a proxy between one client and one node)
    def link(self, kind: str, proxy_id: int, target: str, *cmds: str) -> str:
        assert self.hub is not None
        for c in cmds:
            self.hub.cmd(f"{proxy_id} {c}")
        return self._start(kind, target, proxy=proxy_id, cmds=list(cmds))

    def heal(self, proxy_id: int, fid: str, *cmds: str) -> None:
        assert self.hub is not None
        t = time.monotonic()
        for c in cmds or ("heal",):
            self.hub.cmd(f"{proxy_id} {c}")
        self._end(fid, t)

    def expire_key(self, n: Node, key: str) -> None:
        """A forward clock jump on one node, as far as a lock key is concerned: it expires now."""
        t = time.monotonic()
        had = n.client().pexpire(key, 1)
        wait_until(f"{key} gone on {n.name}", lambda: not n.client().exists(key))
        self._instant("expire_early", n.name, t, key=key, had_key=bool(had))


def read_history(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    out = []
    for line in open(path):
        line = line.strip()
        if line:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a line cut short by a SIGKILL
    return out
