"""Issue 33: the read-write lock and the semaphore across languages. Python, Node and the CLI
(Rust) take the read and write sides of one key against a real redis-server: each sees the
others' holds, and a random mix of readers and writers in several processes of each never
overlaps a writer with anyone; Python and Node holders of one semaphore never hold more than
its permits together (checkers over the recorded intervals, CLOCK_MONOTONIC, shared by every
process)."""

import os
import random
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

import ferrolock

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
NODE_PACKAGE = str(ROOT / "node")
CLI = os.environ.get("FERROLOCK_CLI", str(ROOT / "target" / "debug" / "ferrolock"))
# sysexits' EX_TEMPFAIL: `ferrolock run --wait 0` on a lock held elsewhere (cli/src/main.rs).
CLI_NOT_ACQUIRED = 75


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    d = tmp_path_factory.mktemp("redis")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(d)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(200):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as c:
                c.sendall(b"PING\r\n")
                if c.recv(16).startswith(b"+PONG"):
                    break
        except OSError:
            time.sleep(0.05)
    else:
        server.kill()
        pytest.fail(f"redis-server on port {port} did not start")
    yield f"redis://127.0.0.1:{port}"
    server.kill()
    server.wait()


def fresh_key(name):
    return f"interop-{name}-{uuid.uuid4().hex[:8]}"


def node(script, *args):
    """Runs a Node script with the package as `pkg` and `args` as `argv`; its stdout."""
    prelude = f"const pkg = require({NODE_PACKAGE!r}); const argv = process.argv.slice(1);\n"
    done = subprocess.run(["node", "-e", prelude + script, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


NODE_TRY = """
(async () => {
  const m = new pkg.LockManager({ nodes: [argv[0]], ttl: 10000 });
  const side = argv[2] === 'write' ? 'tryAcquireWrite' : 'tryAcquireRead';
  try {
    const lock = await m[side](argv[1]);
    await lock.release();
    console.log('granted');
  } catch (e) {
    console.log(e.code);
  }
  await m.close();
})();
"""


def cli_try(url, key, kind):
    done = subprocess.run(
        [CLI, "run", f"--{kind}", "--nodes", url, "--wait", "0", key, "--", "true"],
        capture_output=True, text=True, timeout=60,
    )
    return done.returncode


def test_each_language_sees_the_others_holds(url):
    key = fresh_key("sees")
    manager = ferrolock.LockManager(nodes=[url], ttl=10)
    with manager.read_lock(key):
        # Readers of every language share it; writers of every language are kept out.
        assert node(NODE_TRY, url, key, "read") == "granted"
        assert node(NODE_TRY, url, key, "write") == "NOT_ACQUIRED"
        assert cli_try(url, key, "read") == 0
        assert cli_try(url, key, "write") == CLI_NOT_ACQUIRED
    with manager.write_lock(key):
        assert node(NODE_TRY, url, key, "read") == "NOT_ACQUIRED"
        assert cli_try(url, key, "read") == CLI_NOT_ACQUIRED
    # Node holds the write side while Python and the CLI try both sides.
    holder = subprocess.Popen(
        ["node", "-e", f"""
const pkg = require({NODE_PACKAGE!r});
(async () => {{
  const m = new pkg.LockManager({{ nodes: [process.argv[1]], ttl: 10000 }});
  const lock = await m.acquireWrite(process.argv[2]);
  console.log('held');
  process.stdin.on('end', async () => {{ await lock.release(); await m.close(); }});
  process.stdin.resume();
}})();
""", url, key],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ferrolock.NotAcquired):
            with manager.read_lock(key, wait=0):
                pass
        assert cli_try(url, key, "read") == CLI_NOT_ACQUIRED
    finally:
        holder.stdin.close()
        assert holder.wait(timeout=60) == 0
    # Released by Node: every side is free again.
    with manager.write_lock(key, wait=0):
        pass
    manager.close()


def start_workers(mode, url, key, rounds, seed, out):
    """Two Python and two Node workers of `mode` (worker.py), each with a seed of its own."""
    python = [[sys.executable, str(HERE / "worker.py")] for _ in range(2)]
    node = [["node", str(HERE / "worker.js"), NODE_PACKAGE] for _ in range(2)]
    return [
        subprocess.Popen(cmd + [mode, url, key, str(rounds), str(seed + i), str(out)])
        for i, cmd in enumerate(python + node)
    ]


def wait_for(workers):
    for w in workers:
        assert w.wait(timeout=300) == 0, "a worker failed"


def read_holds(out):
    """The recorded holds: (language, kind, start ns, end ns)."""
    holds = []
    for line in out.read_text().splitlines():
        lang, kind, start, end = line.split()
        holds.append((lang, kind, int(start), int(end)))
    return holds


def overlapping_writer(holds):
    """The first pair of holds where a writer overlaps anyone, or None."""
    holds = sorted(holds, key=lambda h: h[2])
    for i, a in enumerate(holds):
        for b in holds[i + 1:]:
            if b[2] >= a[3]:
                break
            if "write" in (a[1], b[1]):
                return a, b
    return None


def test_the_checker_finds_a_writer_overlapping_anyone():
    reads = [("python", "read", 0, 10), ("node", "read", 5, 15)]
    assert overlapping_writer(reads) is None
    assert overlapping_writer(reads + [("cli", "write", 20, 30)]) is None
    assert overlapping_writer(reads + [("cli", "write", 14, 30)]) is not None
    assert overlapping_writer([("node", "write", 0, 10), ("python", "write", 9, 12)]) is not None


def test_a_random_mix_across_languages_never_overlaps_a_writer(url, tmp_path):
    key = fresh_key("mix")
    seed = int(os.environ.get("FERROLOCK_INTEROP_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (FERROLOCK_INTEROP_SEED={seed} replays the workers' choices)")
    out = tmp_path / "holds"
    rounds = 25
    workers = start_workers("rw", url, key, rounds, seed, out)
    # The CLI: one `ferrolock run` per hold (a write in three), its command appending the
    # interval it ran in.
    cli_failures = []

    def cli_loop():
        for i in range(12):
            kind = "write" if i % 3 == 0 else "read"
            done = subprocess.run(
                [CLI, "run", f"--{kind}", "--nodes", url, key, "--",
                 sys.executable, str(HERE / "record.py"), str(out), kind],
                capture_output=True, text=True, timeout=120,
            )
            if done.returncode != 0:
                cli_failures.append(done.stderr)

    t = threading.Thread(target=cli_loop)
    t.start()
    wait_for(workers)
    t.join(timeout=300)
    assert not cli_failures, cli_failures

    holds = read_holds(out)
    # Every hold was recorded, and every language held both sides (else the mix proves little).
    assert len(holds) == 4 * rounds + 12, len(holds)
    sides = {(lang, kind) for lang, kind, _, _ in holds}
    for lang in ("python", "node", "cli"):
        for kind in ("read", "write"):
            assert (lang, kind) in sides, f"no {kind} hold from {lang} (seed {seed})"
    clash = overlapping_writer(holds)
    assert clash is None, f"a writer overlapped another hold: {clash} (seed {seed})"


def most_permits_held(holds):
    """The most permits held at once over `holds` (kind `permits:<count>`)."""
    events = []
    for _, kind, start, end in holds:
        count = int(kind.split(":")[1])
        events += [(start, 1, count), (end, 0, -count)]  # at a tie, the release first
    held = most = 0
    for _, _, delta in sorted(events):
        held += delta
        most = max(most, held)
    return most


def test_the_permit_checker_adds_overlapping_holds():
    assert most_permits_held([("python", "permits:2", 0, 10), ("node", "permits:1", 10, 20)]) == 2
    assert most_permits_held([("python", "permits:2", 0, 10), ("node", "permits:2", 9, 20)]) == 4


NODE_TRY_PERMITS = """
(async () => {
  const m = new pkg.LockManager({ nodes: [argv[0]], ttl: 10000 });
  try {
    const lock = await m.tryAcquirePermit(argv[1], { permits: 3, count: Number(argv[2]) });
    await lock.release();
    console.log('granted');
  } catch (e) {
    console.log(e.code);
  }
  await m.close();
})();
"""


def test_a_semaphore_is_one_pool_for_python_and_node(url, tmp_path):
    name = fresh_key("pool")
    manager = ferrolock.LockManager(nodes=[url], ttl=10)
    with manager.semaphore(name, permits=3, count=2):
        # One permit is left: Node gets it, but not two.
        assert node(NODE_TRY_PERMITS, url, name, "1") == "granted"
        assert node(NODE_TRY_PERMITS, url, name, "2") == "NOT_ACQUIRED"
    assert node(NODE_TRY_PERMITS, url, name, "2") == "granted"
    manager.close()

    seed = int(os.environ.get("FERROLOCK_INTEROP_SEED", random.randrange(1 << 30)))
    print(f"seed {seed}")
    name = fresh_key("sem-mix")
    out = tmp_path / "permits"
    rounds = 20
    wait_for(start_workers("sem:3", url, name, rounds, seed, out))
    holds = read_holds(out)
    assert len(holds) == 4 * rounds
    assert {lang for lang, *_ in holds} == {"python", "node"}
    most = most_permits_held(holds)
    assert most <= 3, f"{most} permits of 3 were held at once (seed {seed})"
