"""The checker on hand-written histories: each check reports what it must, and nothing on a
clean history (the scenarios show it on real ones)."""

from __future__ import annotations

from checker import check


def acq(client, h, key, t0, t1, deadline, token=None, fence=None, episode=None):
    return {"ev": "acquire", "client": client, "h": h, "key": key, "t0": t0, "t1": t1,
            "ok": True, "token": token or f"{client}-{h}", "fence": fence,
            "deadline": deadline, "episode": episode or f"{client}:{h}"}


def rel(client, h, key, t0, result=True, episode=None):
    return {"ev": "release", "client": client, "h": h, "key": key, "t0": t0, "t1": t0 + 0.01,
            "ok": True, "result": result, "episode": episode or f"{client}:{h}"}


def test_clean_history_reports_nothing():
    hist = [acq("A", "a", "k", 0, 0.1, 3.0, fence=1), rel("A", "a", "k", 1.0),
            acq("B", "b", "k", 0.5, 1.1, 4.0, fence=2), rel("B", "b", "k", 2.0)]
    r = check(hist)
    assert r["overlaps"] == r["fence_violations"] == r["non_owner_touch"] == []
    assert r["grants"] == 2 and r["signals"]["missing"] == []


def test_overlap_and_fence_order():
    hist = [acq("A", "a", "k", 0, 0.1, 3.0, fence=2), rel("A", "a", "k", 2.0),
            acq("B", "b", "k", 1.0, 1.1, 4.0, fence=1), rel("B", "b", "k", 3.0)]
    r = check(hist)
    assert len(r["overlaps"]) == 1 and r["overlaps"][0]["seconds"] == 0.9
    assert [v["episode"] for v in r["fence_violations"]] == ["B:b"]


def test_reentry_keeps_its_fence_and_is_no_overlap():
    hist = [acq("A", "a", "k", 0, 0.1, 3.0, token="t", fence=5, episode="A:a"),
            acq("A", "b", "k", 0.2, 0.3, 4.0, token="t", fence=6, episode="A:a"),
            rel("A", "b", "k", 1.0, episode="A:a"), rel("A", "a", "k", 1.1, episode="A:a")]
    r = check(hist)
    assert r["overlaps"] == [] and r["grants"] == 1
    assert "re-entry changed the fence" in r["fence_violations"][0]["why"]


def test_release_after_the_deadline_that_reports_held_touched_the_next_owner():
    hist = [acq("A", "a", "k", 0, 0.1, 3.0), acq("B", "b", "k", 3.5, 3.6, 7.0),
            rel("A", "a", "k", 4.0, result=True), rel("B", "b", "k", 5.0)]
    r = check(hist)
    assert [t["episode"] for t in r["non_owner_touch"]] == ["A:a"]


def test_loss_signals_late_excused_and_missing():
    lost = {"ev": "lost", "client": "A", "h": "a", "key": "k", "t": 3.5, "episode": "A:a"}
    base = [acq("A", "a", "k", 0, 0.1, 3.0), lost, acq("C", "c", "j", 0, 0.1, 2.0),
            acq("D", "d", "i", 0, 0.1, 9.0), rel("D", "d", "i", 1.0)]
    r = check(base, t_end=10.0)
    assert [s["episode"] for s in r["signals"]["late"]] == ["A:a"]
    assert [s["episode"] for s in r["signals"]["missing"]] == ["C:c"]
    paused = [{"fault": "pause_client", "target": "A", "start": 2.0, "end": 4.0},
              {"fault": "kill_client", "target": "C", "start": 1.0, "end": 1.0}]
    r = check(base, paused, t_end=10.0)
    assert r["signals"]["late"] == [] and r["signals"]["late_excused"] == 1
    assert r["signals"]["missing"] == []


def test_lost_update_from_the_resource_log():
    log = [{"ok": 1, "read": 0, "before": 0, "written": 1},
           {"ok": 1, "read": 0, "before": 1, "written": 1},
           {"ok": 0, "read": 1, "before": 1, "written": 2}]
    r = check([], [], log)
    assert [u["index"] for u in r["lost_updates"]] == [1] and r["resource_rejected"] == 1


def test_reads_share_and_a_writer_overlapping_a_read_is_reported():
    def side(ev, s):
        return {**ev, "opts": {"side": s}}

    hist = [side(acq("A", "a", "k", 0, 0.1, 3.0), "read"), rel("A", "a", "k", 2.0),
            side(acq("B", "b", "k", 0.5, 0.6, 3.0), "read"), rel("B", "b", "k", 1.5)]
    r = check(hist)
    assert r["overlaps"] == [] and r["shared_reads"] == 1
    hist.append(side(acq("C", "c", "k", 1.0, 1.2, 4.0), "write"))
    hist.append(rel("C", "c", "k", 3.0))
    r = check(hist)
    assert sorted((o["a"], o["b"]) for o in r["overlaps"]) == [("A:a", "C:c"), ("B:b", "C:c")]


def test_permits_add_up_and_an_over_grant_is_reported():
    def permits(ev, count=1):
        return {**ev, "opts": {"side": "semaphore", "permits": 2, "count": count}}

    hist = [permits(acq("A", "a", "s", 0, 0.1, 3.0)), rel("A", "a", "s", 2.0),
            permits(acq("B", "b", "s", 0.5, 0.6, 3.0)), rel("B", "b", "s", 1.5)]
    r = check(hist)
    assert r["overlaps"] == [] and r["over_granted"] == []
    hist += [permits(acq("C", "c", "s", 1.0, 1.2, 4.0)), rel("C", "c", "s", 3.0)]
    r = check(hist)
    assert [(o["by"], o["held"]) for o in r["over_granted"]] == [("C:c", 3)]


def test_a_downgrade_is_no_overlap_but_an_upgrade_or_another_clients_read_is():
    def side(ev, s, fence=None):
        return {**ev, "opts": {"side": s}, "fence": fence}

    # A writer takes the read lock under its own write hold, releases the write hold first:
    # the read hold (which carries the writer's fence) is no overlap and no fence out of order.
    w = side(acq("A", "w", "k", 0, 0.1, 3.0, token="t"), "write", fence=4)
    r = side(acq("A", "r", "k", 0.5, 0.6, 3.0, token="t"), "read", fence=4)
    hist = [w, r, rel("A", "w", "k", 1.0), rel("A", "r", "k", 2.0)]
    res = check(hist)
    assert res["overlaps"] == [] and res["fence_violations"] == [] and res["downgrades"] == 1
    assert res["sides"] == {"read": 1, "write": 1}
    # The read taken first (an upgrade), or by another client with the same token: overlaps.
    up = [side(acq("A", "r", "k", 0, 0.1, 3.0, token="t"), "read"),
          side(acq("A", "w", "k", 0.5, 0.6, 3.0, token="t"), "write", fence=4),
          rel("A", "w", "k", 1.0), rel("A", "r", "k", 2.0)]
    assert [(o["a"], o["b"]) for o in check(up)["overlaps"]] == [("A:r", "A:w")]
    other = [w, side(acq("B", "r", "k", 0.5, 0.6, 3.0, token="t"), "read"),
             rel("A", "w", "k", 1.0), rel("B", "r", "k", 2.0)]
    assert [(o["a"], o["b"]) for o in check(other)["overlaps"]] == [("A:w", "B:r")]


def test_a_late_release_touches_only_a_holder_it_could_not_share_with():
    def side(ev, s):
        return {**ev, "opts": {"side": s}}

    # A's read release after its deadline still found its hold: a reader started since shares
    # the key, so A touched no other owner; a writer started since is touched.
    def hist(later):
        return [side(acq("A", "a", "k", 0, 0.1, 3.0), "read"),
                side(acq("B", "b", "k", 3.5, 3.6, 7.0), later),
                rel("A", "a", "k", 4.0, result=True), rel("B", "b", "k", 5.0)]

    assert check(hist("read"))["non_owner_touch"] == []
    assert [t["episode"] for t in check(hist("write"))["non_owner_touch"]] == ["A:a"]
