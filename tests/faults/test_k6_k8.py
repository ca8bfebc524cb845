"""K6: a reentrant holder paused past its ttl. K7: the fence counter lost by a restart without
persistence. K8: a deliberately broken lock that the checker must flag."""

from __future__ import annotations

import os
import time

import pytest
from harness import wait_until

TTL = 3.0


def test_k6_paused_reentrant_holder_never_touches_the_new_owners_key(h):
    h.start_nodes(3)
    a = h.client("A", restart_guard=0.0)
    b = h.client("B", restart_guard=0.0)
    opts = {"ttl": TTL, "reentrant": True, "fencing": True, "wait": 30.0}
    outer = a.call(op="acquire", h="a1", key="k6", opts=opts)
    inner = a.call(op="acquire", h="a2", key="k6", opts=dict(opts, ttl=TTL + 1.5))
    assert outer["ok"] and inner["ok"] and inner["token"] == outer["token"]
    assert inner["fence"] == outer["fence"]
    pause = h.nemesis.pause_client(a)
    b_got = b.call(op="acquire", h="b1", key="k6", opts=dict(opts, watchdog=False))
    assert b_got["ok"], b_got
    assert b_got["fence"] > outer["fence"]
    nodes = [n.client() for n in h.nodes]
    mine = {b_got["token"]: "1"}
    # B's grant needs a quorum, not every node: A's copies expire a few ms apart, so a node
    # whose copy outlived the others may have refused B's attempt. Once A's copies are gone,
    # every node holds B's hash or nothing, and B's hash is on a quorum.
    wait_until("A's copies of k6 expired", lambda: all(r.hgetall("k6") in (mine, {}) for r in nodes))
    before = [(r.hgetall("k6"), r.pttl("k6")) for r in nodes]
    assert sum(hv == mine for hv, _ in before) >= 2, before
    h.nemesis.resume_client(a, pause)
    ext = a.call(op="extend", h="a2", ttl=30.0)
    rel_inner = a.call(op="release", h="a2")
    rel_outer = a.call(op="release", h="a1")
    assert ext["ok"] is False, ext
    for rel in (rel_inner, rel_outer):
        assert rel.get("result") is not True, rel
    after = [(r.hgetall("k6"), r.pttl("k6")) for r in nodes]
    for (hv0, p0), (hv1, p1) in zip(before, after):
        if hv0:
            # B's hash unchanged, its expiry only ran down (B has no watchdog: nobody renews it).
            assert hv1 == hv0 and 0 < p1 <= p0, (before, after)
        else:
            # Nothing of A's re-created where the key was gone (B's own late grant may land).
            assert hv1 in ({}, mine), (before, after)
    assert b.call(op="release", h="b1")["result"]
    again = a.call(op="acquire", h="a3", key="k6", opts=opts)
    assert again["ok"] and again["fence"] > b_got["fence"], again
    report = h.check()
    assert report["overlaps"] == [] and report["fence_violations"] == []
    assert report["non_owner_touch"] == []


def _fenced_grant(c, hname: str, key: str) -> dict:
    got = c.call(op="acquire", h=hname, key=key,
                 opts={"ttl": TTL, "fencing": True, "watchdog": False, "wait": 30.0})
    assert got["ok"], got
    assert c.call(op="release", h=hname)["result"]
    return got


def test_k7_one_node_restart_without_persistence_loses_the_fence_order(h):
    """The documented limit: at N = 1 the fence counter lives on one node only."""
    h.start_nodes(1)
    a, b = h.client("A"), h.client("B")
    first = _fenced_grant(a, "a1", "k7")
    h.nemesis.restart_node(h.nodes[0], keep_data=False)
    assert not h.nodes[0].client().keys("*")
    second = _fenced_grant(b, "b1", "k7")
    assert second["fence"] <= first["fence"]
    report = h.check()
    assert len(report["fence_violations"]) == 1, report["fence_violations"]
    assert report["fence_violations"][0]["episode"] == "B:b1"


@pytest.mark.parametrize("guard", [True, False])
def test_k7_five_nodes_keep_the_fence_order_within_the_restart_guards_window(h, guard):
    """A raises the counters on n0..n2 only (its links to n3, n4 cut); n0 restarts without
    persistence; B cannot reach n1, n2. With the guard, n0 does not vote during its window and
    B gets no quorum until n1 and n2 are reachable again, so its quorum meets A's counters.
    Without it, B's quorum n0, n3, n4 has never seen A's fence: the order is lost. (After the
    window the counter is still lost: a quorum meeting A's only at n0 would go back too, the
    documented limit; the guard delays a lost counter, it does not repair it.)"""
    h.start_nodes(5)
    window = 2 * TTL if guard else 0.0
    if guard:
        # Only n0's restart may count against the guard: the others must be older than the
        # window already, or B waits out their windows too and n0, counter lost, can be in
        # its first quorum once they end (the order then depends on which nodes answer first).
        wait_until("nodes older than the guard window",
                   lambda: all(n.client().info("server")["uptime_in_seconds"] > window + 1
                               for n in h.nodes), timeout=30)
    a = h.client("A", proxied=True, restart_guard=0.0)
    b = h.client("B", proxied=True, restart_guard=window)
    cuts = [h.nemesis.link("cut", h.proxy("A", i), f"A->n{i}", "cut") for i in (3, 4)]
    first = _fenced_grant(a, "a1", "k7")
    counters = [n.client().get("ferrolock:fence:{k7}") for n in h.nodes]
    assert counters[3] is None and counters[4] is None, counters
    h.nemesis.restart_node(h.nodes[0], keep_data=False)
    b_cuts = [h.nemesis.link("cut", h.proxy("B", i), f"B->n{i}", "cut") for i in (1, 2)]
    b.send(op="acquire", h="b1", key="k7",
           opts={"ttl": TTL, "fencing": True, "watchdog": False, "wait": 1.5})
    out = b.answer()
    if guard:
        # n0 is inside its window: B has n3, n4 only, no quorum.
        assert out["ok"] is False, out
        for (pid, fid) in zip((h.proxy("B", i) for i in (1, 2)), b_cuts):
            h.nemesis.heal(pid, fid)
        second = _fenced_grant(b, "b2", "k7")
        assert second["fence"] > first["fence"]
        assert h.check()["fence_violations"] == []
    else:
        assert out["ok"] and out["fence"] <= first["fence"], out
        assert len(h.check()["fence_violations"]) == 1


def test_k8_a_broken_lock_is_flagged_by_the_checker(h):
    node = h.start_nodes(1)[0]
    h.start_resource()
    a, b = h.client("A"), h.client("B")
    assert a.call(op="broken_acquire", h="a1", key="k8", port=node.port, ttl=TTL)["ok"]
    assert b.call(op="broken_acquire", h="b1", key="k8", port=node.port, ttl=TTL)["ok"]
    # A reads, B reads and writes, then A writes what it read + 1: B's update is lost. The
    # interleaving is forced (A's read seen in the history, A's write held by a gate file), so
    # a slow machine cannot turn it into two serial updates.
    gate = os.path.join(os.path.dirname(h.history), "k8-a-may-write")
    a.send(op="rmw", h="a1", mode="unfenced", gate=gate)
    wait_until("A has read the counter", lambda: any(
        e.get("ev") == "read" and e.get("h") == "a1" for e in h.history_events()), timeout=120)
    assert b.call(op="rmw", h="b1", mode="unfenced")["applied"]
    open(gate, "w").close()
    assert a.answer()["applied"]
    report = h.check()
    assert len(report["overlaps"]) == 1, report
    assert len(report["lost_updates"]) == 1, report
