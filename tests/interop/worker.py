"""A Python worker of the mix: `python worker.py URL KEY ROUNDS SEED OUT` takes the read or
the write side of KEY at random (a write in three), holds it a few ms, and appends each hold's
interval (CLOCK_MONOTONIC) to OUT."""

import random
import sys
import time

import ferrolock

url, key, rounds, seed, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
rng = random.Random(seed)
manager = ferrolock.LockManager(nodes=[url], ttl=10)
lines = []
for _ in range(rounds):
    kind = "write" if rng.random() < 1 / 3 else "read"
    side = manager.write_lock if kind == "write" else manager.read_lock
    with side(key):
        start = time.monotonic_ns()
        time.sleep(rng.uniform(0.002, 0.006))
        end = time.monotonic_ns()
    lines.append(f"python {kind} {start} {end}\n")
manager.close()
with open(out, "a") as f:
    f.writelines(lines)
