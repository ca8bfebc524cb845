"""K11: the read-write lock's writer under faults (issue 33). A writer paused past its ttl
(three nodes: a hold counts once a quorum granted it) lets a reader in only after its deadline,
is told of its loss on resume, and its release then changes nothing on any node. A writer
SIGKILLed while holding (one node) lets the next writer and reader in only after its lease."""

from __future__ import annotations

from harness import wait_until
from test_k1_k2 import wait_event

TTL = 3.0


def rw_state(node, key: str) -> tuple[dict, list[str]]:
    """The hash and the read holds' keys (ferrolock's own bookkeeping names left out)."""
    r = node.client()
    return r.hgetall(key), sorted(k for k in r.keys("*") if not k.startswith("ferrolock:"))


def test_k11_a_paused_writer_lets_a_reader_in_after_its_deadline_and_its_release_changes_nothing(h):
    h.start_nodes(3)
    a, b = h.client("A", restart_guard=0.0), h.client("B", restart_guard=0.0)
    w = a.call(op="acquire", h="a1", key="k11",
               opts={"side": "write", "ttl": TTL, "fencing": True, "wait": 30.0})
    assert w["ok"], w
    pause = h.nemesis.pause_client(a)
    got = b.call(op="acquire", h="b1", key="k11", opts={"side": "read", "ttl": TTL, "wait": 30.0})
    assert got["ok"], got
    # B's grant needed a quorum only: A's hash may outlive it on the third node. Nobody renews
    # it while A is stopped; once it is gone the nodes change only by B's or A's doing.
    wait_until("A's write holds expired on every node", lambda: not any(
        f.endswith(":write") for n in h.nodes for f in n.client().hkeys("k11")), timeout=2 * TTL)
    held = [rw_state(n, "k11") for n in h.nodes]
    # B's read hold on a quorum: the mode, B's field and its hold key.
    reading = [hv for hv, keys in held if hv.get("mode") == "read" and len(hv) == 2
               and len(keys) == 2]
    assert len(reading) >= 2, held
    h.nemesis.resume_client(a, pause)
    lost = wait_event(h, lambda e: e.get("ev") == "lost" and e["client"] == "A",
                      "A told of its loss")
    rel = a.call(op="release", h="a1")
    assert rel.get("result") is not True, rel
    # A's release after its loss touched nothing: B's hold is intact on every node.
    assert [rw_state(n, "k11") for n in h.nodes] == held
    assert b.call(op="release", h="b1")["result"]
    assert [rw_state(n, "k11") for n in h.nodes] == [({}, [])] * 3

    _, paused = h.granted_while_paused_after("B", "A:a1")
    assert lost["t"] > paused["end"]
    report = h.check()
    assert report["overlaps"] == [] and report["non_owner_touch"] == [], report
    s = report["signals"]
    # Told late, but A was stopped across its deadline: excused, and the only loss.
    assert s["lost"] == 1 and s["late_excused"] == 1 and s["late"] == [], s


def test_k11_a_killed_writers_hold_goes_to_the_next_writer_and_reader_only_after_its_lease(h):
    h.start_nodes(1)
    a, b, c = (h.client(n) for n in ("A", "B", "C"))
    w = a.call(op="acquire", h="a1", key="k11",
               opts={"side": "write", "ttl": TTL, "fencing": True, "wait": 30.0})
    assert w["ok"], w
    # A writer and a reader of two other processes wait behind A.
    b.send(op="acquire", h="b1", key="k11",
           opts={"side": "write", "ttl": TTL, "fencing": True, "wait": 60.0})
    c.send(op="acquire", h="c1", key="k11", opts={"side": "read", "ttl": TTL, "wait": 60.0})
    h.nemesis.kill_client(a)
    # Whoever is granted first releases; then the other is granted.
    first = wait_event(h, lambda e: e.get("ev") == "acquire" and e["client"] in ("B", "C"),
                       "B or C granted", timeout=60)
    assert first["ok"], first
    waiting = {"B": (b, "b1"), "C": (c, "c1")}
    one, one_h = waiting.pop(first["client"])
    (other, other_h), = waiting.values()
    assert one.answer()["ok"]
    assert one.call(op="release", h=one_h)["result"]
    got = other.answer()
    assert got["ok"], got
    assert other.call(op="release", h=other_h)["result"]
    assert rw_state(h.nodes[0], "k11") == ({}, [])

    faults = h.faults.read()
    assert [f["fault"] for f in faults] == ["kill_client"]
    ev = h.history_events()
    a_deadline = h.latest_deadline("A:a1")
    # The kill landed inside A's lease, which alone kept the others out until it ended.
    assert faults[0]["start"] < a_deadline
    grants = [e for e in ev if e.get("ev") == "acquire" and e["client"] in ("B", "C")]
    assert len(grants) == 2 and all(g["ok"] for g in grants), grants
    assert min(g["t1"] for g in grants) >= a_deadline
    report = h.check()
    assert report["overlaps"] == [] and report["fence_violations"] == [], report
    assert report["shared_reads"] == 0
    # No loss signal: the killed writer could not be told, the others released in time.
    assert report["signals"]["lost"] == 0 and report["signals"]["missing"] == [], report
