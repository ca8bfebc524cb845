"""The READMEs' and docs' Python examples run as written (against a test server via FERROLOCK_NODES)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import Child, RedisNode

HERE = Path(__file__).resolve()
# The package's README section, the project README's Python example, and the docs' examples.
ROOT = HERE.parents[2]
READMES = [
    HERE.parents[1] / "README-section.md",
    ROOT / "README.md",
    ROOT / "docs" / "read-write-lock.md",
    ROOT / "docs" / "semaphore.md",
]


@pytest.mark.parametrize("readme", READMES, ids=lambda p: p.parent.name + "/" + p.name)
def test_readme_examples_run(node: RedisNode, readme: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", readme.read_text(), flags=re.S)
    assert blocks, f"no python example in {readme}"
    for block in blocks:
        child = Child(block + '\nprint("README-OK", flush=True)\n', env={"FERROLOCK_NODES": node.url})
        try:
            child.expect("README-OK", timeout=60)
            assert child.wait(30) == 0, "".join(child.err)
        finally:
            child.kill()
