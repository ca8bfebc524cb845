"""Fixtures of the fault suite: a ``Harness`` per test with its own servers, proxies, client
processes, fault log and history, all stopped at the end."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from checker import check  # noqa: E402
from harness import (ROOT, ClientProc, FaultLog, Nemesis, Node, ProxyHub,  # noqa: E402
                     read_history)
from resource import read_log  # noqa: E402


class Harness:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.history = str(tmp / "history.jsonl")
        self.faults = FaultLog(str(tmp / "faults.jsonl"))
        self.hub = ProxyHub()
        self.nemesis = Nemesis(self.faults, self.hub)
        self.nodes: list[Node] = []
        self.clients: list[ClientProc] = []
        self.resource: Node | None = None
        # (client name, node index) -> proxy id
        self.proxies: dict[tuple[str, int], int] = {}

    def start_nodes(self, n: int) -> list[Node]:
        self.nodes = [Node(f"n{i}") for i in range(n)]
        return self.nodes

    def start_resource(self) -> Node:
        self.resource = Node("resource")
        return self.resource

    def client(self, name: str, proxied: bool = False, resource_port: int | None = None,
               **manager) -> ClientProc:
        """A client process; with ``proxied`` each of its links to a node goes through a proxy
        of its own, so its network can be faulted without touching anyone else's."""
        urls = []
        for i, n in enumerate(self.nodes):
            if proxied:
                pid, port = self.hub.new(n.port)
                self.proxies[(name, i)] = pid
                urls.append(f"redis://127.0.0.1:{port}")
            else:
                urls.append(n.url)
        if resource_port is None and self.resource is not None:
            resource_port = self.resource.port
        c = ClientProc(name, urls, self.history, resource_port, manager)
        self.clients.append(c)
        return c

    def proxy(self, client: str, node: int) -> int:
        return self.proxies[(client, node)]

    def history_events(self) -> list[dict]:
        return read_history(self.history)

    def latest_deadline(self, episode: str) -> float:
        """The last validity deadline the history gave `episode` ("client:handle"), across
        its grant and renewals: no one else may be granted before it."""
        return max(e["deadline"] for e in self.history_events()
                   if e.get("episode") == episode and e.get("deadline") is not None)

    def first_grant(self, client: str, handle: str | None = None) -> dict:
        """The history's first acquire event of `client` (of its `handle`, if given)."""
        return next(e for e in self.history_events() if e.get("ev") == "acquire"
                    and e["client"] == client and (handle is None or e["h"] == handle))

    def granted_while_paused_after(self, client: str, episode: str) -> tuple[dict, dict]:
        """Asserts the one fault was a client's pause, and `client` was granted during it
        but not before `episode`'s last deadline; returns the grant and the pause."""
        faults = self.faults.read()
        assert [f["fault"] for f in faults] == ["pause_client"]
        grant = self.first_grant(client)
        pause = faults[0]
        assert pause["start"] < grant["t1"] < pause["end"], f"{client} was granted outside the pause"
        assert grant["t1"] >= self.latest_deadline(episode)
        return grant, pause

    def check(self) -> dict:
        log = read_log(self.resource.port) if self.resource else None
        return check(self.history_events(), self.faults.read(), log)

    def close(self) -> None:
        for c in self.clients:
            c.stop()
        for n in self.nodes:
            n.stop()
        if self.resource and self.resource not in self.nodes:
            self.resource.stop()
        self.hub.stop()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    if rep.when == "call":
        item.failed_call = rep.failed
    return rep


@pytest.fixture
def h(request):
    """A failed test's history and fault log are kept in target/faults-failures/<test>/."""
    with tempfile.TemporaryDirectory(prefix="ferrolock-faults-") as d:
        harness = Harness(Path(d))
        try:
            yield harness
        finally:
            harness.close()
            if getattr(request.node, "failed_call", False):
                keep = ROOT / "target" / "faults-failures" / request.node.name
                shutil.rmtree(keep, ignore_errors=True)
                shutil.copytree(d, keep)
                print(f"history and faults kept in {keep}")
