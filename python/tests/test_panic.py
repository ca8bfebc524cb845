"""A panic inside the library reaches the "ferrolock" logger, never stderr.

`_panic_for_test` is a hidden entry point that panics inside the call (nothing in the library
panics on purpose). It runs in a child interpreter so its stderr can be read whole.
"""

from __future__ import annotations

import subprocess
import sys

CHILD = r"""
import logging, time, ferrolock
from ferrolock import _ferrolock

records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append((record.levelname, record.getMessage()))
logging.getLogger("ferrolock").addHandler(Keep())

try:
    _ferrolock._panic_for_test()
except BaseException as e:  # PyO3's PanicException derives from BaseException
    print("raised", type(e).__name__, flush=True)

# The record is handed to `logging` from a library thread: wait for it, up to a bound that
# only ends a failing run.
deadline = time.monotonic() + 60
while not any("_panic_for_test was called" in m for _, m in records):
    if time.monotonic() > deadline:
        break
    time.sleep(0.01)
print("logged", [r for r in records if "_panic_for_test" in r[1]], flush=True)
"""


def test_a_panic_in_an_entry_point_goes_to_the_logger_not_stderr() -> None:
    child = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120
    )
    assert "raised PanicException" in child.stdout, (child.stdout, child.stderr)
    assert child.stderr == "", child.stderr
    assert "logged [('ERROR', 'ferrolock bug: panicked at" in child.stdout, child.stdout
