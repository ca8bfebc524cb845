"""K1: a client paused past its ttl after acquiring. K2: acquire replies held past the ttl."""

from __future__ import annotations

import time

import pytest
from harness import wait_until

TTL = 3.0


def wait_event(h, pred, what: str, timeout: float = 30.0) -> dict:
    found: list[dict] = []

    def seen() -> bool:
        found[:] = [e for e in h.history_events() if pred(e)]
        return bool(found)

    wait_until(what, seen, timeout)
    return found[0]


@pytest.mark.parametrize("mode", ["unfenced", "fenced", "checked"])
def test_k1_paused_holder_writes_after_its_ttl(h, mode):
    node = h.start_nodes(1)[0]
    if mode == "checked":
        # Token-checked: the resource lives on the lock's own node, and a write applies only
        # while the lock key still holds the writer's token.
        h.resource = node
    else:
        h.start_resource()
    a, b = h.client("A"), h.client("B")
    opts = {"ttl": TTL, "fencing": True, "wait": 30.0}
    assert a.call(op="acquire", h="a1", key="k1", opts=opts)["ok"]
    # A reads the counter, then is stopped (its watchdog with it) before it writes.
    a.send(op="rmw", h="a1", mode=mode, sleep=2.0)
    wait_event(h, lambda e: e.get("ev") == "read" and e["client"] == "A", "A read the counter")
    pause = h.nemesis.pause_client(a)
    # B gets the lock once A's key expired, and writes.
    got = b.call(op="acquire", h="b1", key="k1", opts=opts)
    assert got["ok"], got
    wrote = b.call(op="rmw", h="b1", mode=mode)
    assert wrote["applied"], wrote
    assert b.call(op="release", h="b1")["result"]
    h.nemesis.resume_client(a, pause)
    stale = a.answer()
    assert stale["ok"] and stale["read"] == 0, stale

    faults = h.faults.read()
    assert [f["fault"] for f in faults] == ["pause_client"]
    ev = h.history_events()
    a_write = next(e for e in ev if e.get("ev") == "write" and e["client"] == "A")
    b_acq = h.first_grant("B")
    # The fault happened where it matters: A wrote after its pause, B got the lock during it.
    assert faults[0]["start"] < b_acq["t1"] < faults[0]["end"] <= a_write["tw"]

    report = h.check()
    assert report["overlaps"] == [], report["overlaps"]
    assert len(report["stale_use"]) == 1 and report["stale_use"][0]["episode"] == "A:a1"
    if mode == "unfenced":
        # The negative control: the stale write is applied and B's update is lost.
        assert stale["applied"] is True
        assert len(report["lost_updates"]) == 1, report["lost_updates"]
        assert report["lost_updates"][0]["client"] == "A"
    else:
        assert stale["applied"] is False
        assert report["lost_updates"] == []
        assert report["resource_rejected"] == 1
        assert report["fence_violations"] == []
        assert h.resource.client().get("faults:resource:counter:k1") == "1"


def test_k2_acquire_replies_held_past_the_ttl_are_no_grant(h):
    node = h.start_nodes(1)[0]
    a = h.client("A", proxied=True)
    b = h.client("B")
    pid = h.proxy("A", 0)
    # Connected and scripts loaded first, so that what is held is the acquire's own reply.
    assert a.call(op="acquire", h="warm", key="warm", opts={"ttl": TTL})["ok"]
    assert a.call(op="release", h="warm")["result"]
    # Every reply from the node to A is held; its requests still reach the node.
    held = h.nemesis.link("hold_replies", pid, "A->n0", "hold down")
    a.send(op="acquire", h="a1", key="k2", opts={"ttl": TTL, "wait": 0.0})
    r = node.client()
    # Proof the fault bites: A's SET was applied on the node while A heard nothing back.
    wait_until("A's SET reached the node", lambda: r.exists("k2"))
    held_token = r.get("k2")
    # Past the ttl: the key A set has expired on the node, and B can take the lock.
    wait_until("A's key expired", lambda: not r.exists("k2"), timeout=TTL + 10)
    got = b.call(op="acquire", h="b1", key="k2", opts={"ttl": TTL, "wait": 10.0})
    assert got["ok"], got
    h.nemesis.heal(pid, held, "release down")
    out = a.answer()
    assert out["ok"] is False, f"a reply held past the ttl was taken as a grant: {out}"
    assert r.get("k2") == got["token"] != held_token
    assert b.call(op="release", h="b1")["result"]
    # Healed: A gets the lock normally again.
    assert a.call(op="acquire", h="a2", key="k2", opts={"ttl": TTL, "wait": 10.0})["ok"]
    report = h.check()
    assert report["overlaps"] == []
    assert not any(e["episode"] == "A:a1" for e in report["signals"]["missing"])
    assert report["grants"] == 3
