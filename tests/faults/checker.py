"""Checks a history of lock operations (client.py) against the lock's guarantees.

A grant is an *episode*: an acquisition and, for a reentrant lock, its re-entries by the same
owner (they share the token). Its window runs from its first acquire completing to the earlier
of the invocation of its last release and its latest deadline (acquire, extend and renewals
move the deadline; the clients log every move they see).

Reported:
- overlaps: two episodes of one key whose windows intersect, unless both are reads of a
  read-write lock (acquired with `side` "read": those may share, and are counted as
  `shared_reads`), or both hold permits of a semaphore (`side` "semaphore"), or one is a read
  that a writer took under its own write hold (a downgrade: same client and token, the write
  first; counted as `downgrades`);
- over-granted permits: an instant at which a semaphore's holds added up to more than its
  permits (`permits_peak`: the most held at once, per name);
- lost updates on the resource: an applied write whose value read earlier is not the counter's
  value when it was applied (from the resource's own log, in the server's order);
- fence order: an episode whose fence is not greater than that of every episode of the key
  whose acquire completed before its acquire was invoked; a re-entry with another fence (read
  holds are left out: fences order writers, and a downgrade's read carries its writer's);
- stale use: a resource write made after the writer's own latest deadline;
- non-owner touch: a release that reported it still held the key, or an extend that
  succeeded, after the episode's deadline, once another episode of the key had started;
- late loss signals: a loss signal after the deadline, for a client not paused across it; and
  missing ones: an episode whose deadline passed while its client ran, unreleased and unsignalled;
- availability: acquire latency p50/p99; time from each fault's end to the next grant.
"""

from __future__ import annotations

import bisect
import json
import statistics
import sys
from collections import defaultdict
from typing import Any

INF = float("inf")


def _pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


class Episode:
    def __init__(self, eid: str, key: str, client: str, token: str) -> None:
        self.id, self.key, self.client, self.token = eid, key, client, token
        self.t0 = INF  # first acquire invoked
        self.start = INF  # first acquire completed
        self.fences: list[Any] = []
        self.handles: set[str] = set()
        self.released: dict[str, float] = {}  # handle -> release invoked
        self.deadlines: list[tuple[float, float]] = []  # (seen at, deadline)
        self.lost: list[dict] = []
        self.side: str | None = None  # "read" or "write" for a read-write lock's hold

    @property
    def fence(self):
        return self.fences[0] if self.fences else None

    def deadline(self, before: float = INF) -> float:
        ds = [d for t, d in self.deadlines if t <= before]
        return max(ds) if ds else -INF

    @property
    def end(self) -> float:
        rel = max(self.released.values()) if self.handles and set(self.released) >= self.handles \
            else INF
        return min(rel, self.deadline())


def may_share(a: Episode, b: Episode) -> bool:
    """Two holds of one key that may overlap: two reads, two holds of permits (whose sum the
    over-grant sweep checks), and a read its owner took under its own write hold (a downgrade;
    never the other way round, an upgrade, which the lock refuses)."""
    if a.side == b.side and a.side in ("read", "semaphore"):
        return True
    w, r = (a, b) if a.side == "write" else (b, a)
    return (w.side, r.side) == ("write", "read") and w.client == r.client \
        and w.token == r.token and w.start <= r.start


def episodes_of(history: list[dict]) -> dict[str, Episode]:
    eps: dict[str, Episode] = {}
    for ev in sorted(history, key=lambda e: e.get("t1", e.get("t", 0))):
        kind = ev.get("ev")
        eid = ev.get("episode")
        if kind == "acquire" and ev.get("ok"):
            e = eps.setdefault(eid, Episode(eid, ev["key"], ev["client"], ev["token"]))
            e.t0, e.start = min(e.t0, ev["t0"]), min(e.start, ev["t1"])
            e.side = (ev.get("opts") or {}).get("side")
            e.permits = (ev.get("opts") or {}).get("permits")
            e.count = (ev.get("opts") or {}).get("count", 1)
            e.fences.append(ev.get("fence"))
            e.handles.add(ev["client"] + "/" + ev["h"])
            e.deadlines.append((ev["t1"], ev["deadline"]))
        elif eid in eps:
            e = eps[eid]
            if kind == "release":
                e.released[ev["client"] + "/" + ev["h"]] = ev["t0"]
            elif kind == "extend" and ev.get("ok"):
                e.deadlines.append((ev["t1"], ev["deadline"]))
            elif kind == "deadline":
                e.deadlines.append((ev["t"], ev["deadline"]))
            elif kind == "lost":
                e.lost.append(ev)
                if ev.get("deadline") is not None:
                    e.deadlines.append((ev["t"], ev["deadline"]))
    return eps


def paused_across(faults: list[dict], client: str, t: float) -> bool:
    """The client was stopped (or killed) at some point in the second before t, or at t: its
    watchdog could not run to tell it in time."""
    for f in faults:
        if f.get("target") != client:
            continue
        if f["fault"] in ("pause_client", "kill_client") and f["start"] <= t + 0.001 \
                and f.get("end", INF) >= t - 1.0:
            return True
    return False


def check(history: list[dict], faults: list[dict] | None = None,
          resource_log: list[dict] | None = None, t_end: float | None = None) -> dict:
    faults = faults or []
    eps = episodes_of(history)
    by_key: dict[str, list[Episode]] = defaultdict(list)
    for e in eps.values():
        by_key[e.key].append(e)
    t_end = t_end if t_end is not None else max(
        [ev.get("t1", ev.get("t", 0)) for ev in history] or [0])
    killed = {f["target"] for f in faults if f["fault"] == "kill_client"}

    overlaps = []
    shared_reads = downgrades = 0
    for key, es in by_key.items():
        es.sort(key=lambda e: e.start)
        for i, a in enumerate(es):
            for b in es[i + 1:]:
                if b.start >= a.end:
                    break  # the later ones start later still
                if a.start < b.end and may_share(a, b):
                    shared_reads += a.side == b.side == "read"
                    downgrades += a.side != b.side
                elif a.start < b.end:
                    overlaps.append({"key": key, "a": a.id, "b": b.id, "a_fence": a.fence,
                                     "b_fence": b.fence,
                                     "seconds": round(min(a.end, b.end) - b.start, 4)})

    over_granted = []
    permits_peak = {}
    for key, es in by_key.items():
        held = [e for e in es if e.side == "semaphore" and e.end > e.start]
        if not held:
            continue
        events = sorted([(e.start, 1, e.count, e.id) for e in held]
                        + [(e.end, 0, -e.count, e.id) for e in held])  # a tie: the end first
        permits = min(e.permits for e in held)
        n = 0
        for t, _, delta, eid in events:
            n += delta
            permits_peak[key] = max(permits_peak.get(key, 0), n)
            if delta > 0 and n > permits:
                over_granted.append({"key": key, "at": t, "held": n, "permits": permits,
                                     "by": eid})

    fence_violations = []
    for key, es in by_key.items():
        fenced = [e for e in es if e.fence is not None and e.side != "read"]
        for e in fenced:
            if len(set(e.fences)) > 1:
                fence_violations.append({"key": key, "episode": e.id, "why": "re-entry changed "
                                         f"the fence: {e.fences}"})
        done = sorted(fenced, key=lambda e: e.start)
        ends = [e.start for e in done]
        prefix_max: list[tuple[int, str]] = []
        best: tuple[int, str] = (-1, "")
        for e in done:
            if e.fence > best[0]:
                best = (e.fence, e.id)
            prefix_max.append(best)
        for e in fenced:
            i = bisect.bisect_left(ends, e.t0)
            if i and prefix_max[i - 1][0] >= e.fence:
                fence_violations.append({"key": key, "episode": e.id, "fence": e.fence,
                                         "earlier": prefix_max[i - 1][1],
                                         "earlier_fence": prefix_max[i - 1][0]})

    lost_updates = []
    rejected = 0
    if resource_log:
        for i, w in enumerate(resource_log):
            if not w["ok"]:
                rejected += 1
            elif w["read"] != w["before"]:
                lost_updates.append({"index": i, **w})

    stale_use = []
    non_owner = []
    writes = 0
    for ev in history:
        e = eps.get(ev.get("episode"))
        if e is None:
            continue
        if ev.get("ev") == "write" and ev.get("ok"):
            writes += 1
            d = e.deadline(ev["tw"])
            if ev["tw"] > d:
                stale_use.append({"episode": e.id, "late_by": round(ev["tw"] - d, 4),
                                  "applied": ev.get("applied"), "fence": ev.get("fence"),
                                  "mode": ev.get("mode")})
        touched = (ev.get("ev") == "release" and ev.get("result")) or (
            ev.get("ev") == "extend" and ev.get("ok"))
        if touched:
            d = e.deadline(ev["t0"])
            later = [o for o in by_key[e.key] if o is not e and d <= o.start <= ev["t0"]
                     and not may_share(e, o)]
            if ev["t0"] > d and later:
                non_owner.append({"episode": e.id, "op": ev["ev"], "others": [o.id for o in later]})

    signals = {"lost": 0, "before_deadline": 0, "late": [], "late_excused": 0, "missing": []}
    for e in eps.values():
        if e.lost:
            ev = e.lost[0]
            signals["lost"] += 1
            d = e.deadline(ev["t"])
            if ev["t"] <= d:
                signals["before_deadline"] += 1
            elif paused_across(faults, e.client.split("/")[0], d):
                signals["late_excused"] += 1
            else:
                signals["late"].append({"episode": e.id, "late_by": round(ev["t"] - d, 4),
                                        "reason": ev.get("reason")})
        else:
            d = e.deadline()
            released_before = e.released and min(e.released.values()) <= d
            if d < t_end - 1.0 and not released_before and e.client.split("/")[0] not in killed \
                    and not paused_across(faults, e.client.split("/")[0], d) \
                    and "/fork" not in e.client:
                signals["missing"].append({"episode": e.id, "deadline": d})

    acquires = [ev for ev in history if ev.get("ev") == "acquire"]
    lat = [ev["t1"] - ev["t0"] for ev in acquires if ev.get("ok")]
    grants_t = sorted(ev["t1"] for ev in acquires if ev.get("ok"))
    recovery: dict[str, list[float]] = defaultdict(list)
    for f in faults:
        if "end" not in f:
            continue
        i = bisect.bisect_right(grants_t, f["end"])
        recovery[f["fault"]].append(grants_t[i] - f["end"] if i < len(grants_t) else INF)

    return {
        "grants": len(eps),
        # Episodes by kind: a lock, or a `side` (read, write, semaphore).
        "sides": dict(sorted(_count(e.side or "lock" for e in eps.values()).items())),
        "acquires": len(acquires),
        "acquire_ok": len(lat),
        "acquire_errors": dict(sorted(_count(ev.get("err") for ev in acquires
                                             if not ev.get("ok")).items())),
        "reentries": sum(len(e.handles) - 1 for e in eps.values()),
        "overlaps": overlaps,
        "shared_reads": shared_reads,
        "downgrades": downgrades,
        "over_granted": over_granted,
        "permits_peak": permits_peak,
        "fence_violations": fence_violations,
        "writes": writes,
        "resource_writes": len(resource_log or []),
        "resource_rejected": rejected,
        "lost_updates": lost_updates,
        "stale_use": stale_use,
        "non_owner_touch": non_owner,
        "signals": signals,
        "latency": {"p50": _pct(lat, 50), "p99": _pct(lat, 99), "max": max(lat, default=None)},
        "recovery": {k: {"n": len(v), "median": statistics.median(v), "max": max(v)}
                     for k, v in sorted(recovery.items())},
        "faults": dict(sorted(_count(f["fault"] for f in faults).items())),
        "forks": sum(1 for ev in history if ev.get("ev") == "fork_done"),
        # A forked child that saw its parent's lock as held by itself (the package must not).
        "fork_inherited_held": [ev for ev in history if ev.get("ev") == "fork_inherited_held"],
        "interrupted": sum(1 for ev in history if ev.get("ev") == "interrupted"),
        # Exceptions in the client's own code (not lock errors): a harness bug, not a finding.
        "client_errors": [ev for ev in history if ev.get("ev") == "client_error"],
    }


def _count(xs) -> dict:
    out: dict = defaultdict(int)
    for x in xs:
        out[x] += 1
    return dict(out)


def main() -> None:
    """python checker.py HISTORY [FAULTS] [RESOURCE_LOG]: prints the report as JSON."""
    def load(p):
        return [json.loads(x) for x in open(p) if x.strip()]
    hist = load(sys.argv[1])
    faults = load(sys.argv[2]) if len(sys.argv) > 2 else []
    res = load(sys.argv[3]) if len(sys.argv) > 3 else None
    print(json.dumps(check(hist, faults, res), indent=2, default=str))


if __name__ == "__main__":
    main()
