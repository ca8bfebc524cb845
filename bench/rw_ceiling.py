#!/usr/bin/env python3
"""The read-mostly workload's ceiling (issue 33): what any lock can reach, by simulation.

The bench's read-mostly scenario (`ferrolock-bench --scenario rw`) runs 4 processes, each
looping: pick a write with probability 10 % (else a read), acquire, hold 1 ms, release. Its
target compares sections/s on the read-write lock with the same loop on an exclusive lock.
This model runs that loop on an ideal lock with a fixed request latency (`--acquire`: from a
release to the same process's next request being seen) and a fixed wake-up latency
(`--handoff`: from a release to the grant of a waiter it frees), under the read-write lock's
order: a reader queued behind a waiting writer waits for it (writers are not starved, as
issue 33 requires); `--reader-first` lets readers pass waiting writers instead.

With no latency at all the ratio is about 2.75x (not 1 / (0.9/4 + 0.1) = 3.1x: before each
write the readers drain one by one, and the CPUs' parallelism idles meanwhile). Run with no
arguments for the table quoted in bench/results/rw-semaphore.md.
"""

from __future__ import annotations

import argparse
import heapq
import random


def simulate(*, exclusive: bool, reader_first: bool = False, procs: int = 4,
             write_share: float = 0.1, section_ms: float = 1.0, acquire_ms: float = 0.0,
             handoff_ms: float = 0.0, span_ms: float = 20_000.0, seed: int = 1) -> float:
    """Sections per second of `procs` looping processes over `span_ms` of simulated time."""
    rnd = random.Random(seed)
    events: list[tuple[float, int, str, int, bool]] = []  # (time, seq, kind, proc, write)
    seq = 0
    queue: list[tuple[int, bool]] = []  # waiting (proc, write), in arrival order
    readers: set[int] = set()
    writer: int | None = None
    done = 0

    def push(t: float, kind: str, proc: int, write: bool) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, proc, write))

    def request(proc: int, now: float) -> None:
        write = exclusive or rnd.random() < write_share
        push(now + acquire_ms, "request", proc, write)

    def grant_waiters(now: float, latency: float) -> None:
        nonlocal writer
        i = 0
        while i < len(queue) and writer is None:
            proc, write = queue[i]
            if write:
                if i == 0 and not readers:
                    queue.pop(0)
                    writer = proc
                    push(now + latency + section_ms, "release", proc, True)
                    return
                if not reader_first:
                    return  # nobody passes a waiting writer
                i += 1
            else:
                queue.pop(i)
                readers.add(proc)
                push(now + latency + section_ms, "release", proc, False)

    for p in range(procs):
        request(p, 0.0)
    while events:
        now, _, kind, proc, write = heapq.heappop(events)
        if now > span_ms:
            break
        if kind == "request":
            queue.append((proc, write))
            grant_waiters(now, 0.0)
        else:
            done += 1
            if write:
                writer = None
            else:
                readers.discard(proc)
            request(proc, now)
            grant_waiters(now, handoff_ms)
    return done / span_ms * 1000.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--section", type=float, help="ms held per section")
    ap.add_argument("--acquire", type=float, help="ms from a release to the next request")
    ap.add_argument("--handoff", type=float, help="ms from a release to a freed waiter's grant")
    ap.add_argument("--reader-first", action="store_true", help="readers pass waiting writers")
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args()
    rows = [(1.0, 0.0, 0.0), (1.07, 0.3, 0.17)]
    if a.section is not None or a.acquire is not None or a.handoff is not None:
        rows = [(a.section or 1.0, a.acquire or 0.0, a.handoff or 0.0)]
    print("| section ms | acquire ms | hand-off ms | exclusive /s | read-write /s | ratio |")
    print("|---:|---:|---:|---:|---:|---:|")
    for section, acq, hand in rows:
        kw = dict(section_ms=section, acquire_ms=acq, handoff_ms=hand)
        ex = [simulate(exclusive=True, seed=s, **kw) for s in range(a.seeds)]
        rw = [simulate(exclusive=False, reader_first=a.reader_first, seed=s, **kw)
              for s in range(a.seeds)]
        ex_m, rw_m = sum(ex) / len(ex), sum(rw) / len(rw)
        print(f"| {section} | {acq} | {hand} | {ex_m:,.0f} | {rw_m:,.0f} | {rw_m / ex_m:.2f}x |")


if __name__ == "__main__":
    main()
