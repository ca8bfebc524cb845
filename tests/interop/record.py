"""Run by `ferrolock run --read/--write KEY -- python3 record.py OUT KIND`: appends the
interval it held the lock for (CLOCK_MONOTONIC, shared by every process on the machine)."""

import random
import sys
import time

out, kind = sys.argv[1], sys.argv[2]
start = time.monotonic_ns()
time.sleep(random.uniform(0.002, 0.006))
end = time.monotonic_ns()
with open(out, "a") as f:
    f.write(f"cli {kind} {start} {end}\n")
