"""A Python worker of the mixes: `python worker.py MODE URL KEY ROUNDS SEED OUT`. MODE `rw`
takes the read or the write side of KEY at random (a write in three); MODE `sem:P` takes 1 or 2
permits (2 in four) of the semaphore KEY, a pool of P. Each hold lasts a few ms; its interval
(CLOCK_MONOTONIC) is appended to OUT."""

import random
import sys
import time

import ferrolock

mode, url, key, out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[6]
rounds, seed = int(sys.argv[4]), int(sys.argv[5])
rng = random.Random(seed)
manager = ferrolock.LockManager(nodes=[url], ttl=10)
lines = []
for _ in range(rounds):
    if mode == "rw":
        kind = "write" if rng.random() < 1 / 3 else "read"
        hold = manager.write_lock(key) if kind == "write" else manager.read_lock(key)
    else:
        count = 2 if rng.random() < 1 / 4 else 1
        kind = f"permits:{count}"
        hold = manager.semaphore(key, permits=int(mode.split(":")[1]), count=count)
    with hold:
        start = time.monotonic_ns()
        time.sleep(rng.uniform(0.002, 0.006))
        end = time.monotonic_ns()
    lines.append(f"python {kind} {start} {end}\n")
manager.close()
with open(out, "a") as f:
    f.writelines(lines)
