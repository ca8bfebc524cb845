"""K9: the read-write lock under a link cut (issue 33). Readers of two processes share the key;
a reader cut off from the majority is told before its deadline, and a writer gets the write
side only once that reader's holds expired on the servers it could no longer reach."""

from __future__ import annotations

import time

from harness import warmed_up


def test_k9_reader_cut_from_the_majority_is_told_and_the_writer_waits_for_its_expiry(h):
    h.start_nodes(5)
    a = h.client("A", proxied=True, restart_guard=0.0)
    c = h.client("C", restart_guard=0.0)
    # C's one try below must be granted: connected first, as that try's node timeout (200 ms)
    # is no time to connect on a loaded machine too.
    warmed_up(c)
    b = h.client("B", restart_guard=0.0)
    ttl = 3.0
    got = a.call(op="acquire", h="a1", key="k9", opts={"side": "read", "ttl": ttl, "wait": 30.0})
    assert got["ok"], got
    # A reader of another process shares the key while A reads.
    shared = c.call(op="acquire", h="c1", key="k9", opts={"side": "read", "ttl": ttl, "wait": 0.0})
    assert shared["ok"], shared
    assert c.call(op="release", h="c1")["ok"]
    cuts = [h.nemesis.link("cut", h.proxy("A", i), f"A->n{i}", "cut") for i in (0, 1, 2)]
    t_cut = time.monotonic()
    w = b.call(op="acquire", h="b1", key="k9", opts={"side": "write", "ttl": ttl, "wait": 30.0})
    assert w["ok"], w
    ev = h.history_events()
    lost = [e for e in ev if e.get("ev") == "lost" and e["client"] == "A"]
    assert len(lost) == 1, lost
    assert lost[0]["t"] > t_cut
    report = h.check()
    # The two readers overlapped (allowed), the writer overlapped nobody.
    assert report["shared_reads"] == 1, report
    assert report["overlaps"] == [], report["overlaps"]
    s = report["signals"]
    assert s["lost"] == 1 and s["before_deadline"] == 1 and s["late"] == [], s
    # The writer only after A's holds expired on the servers (A's last deadline).
    b_acq = h.first_grant("B")
    a_deadline = h.latest_deadline("A:a1")
    assert b_acq["t1"] >= a_deadline
    for pid, fid in zip((h.proxy("A", i) for i in (0, 1, 2)), cuts):
        h.nemesis.heal(pid, fid)
