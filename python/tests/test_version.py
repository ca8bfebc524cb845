"""The package's version is the workspace's (Cargo.toml), the one place it is set."""

import tomllib
from pathlib import Path

import ferrolock


def test_version_is_the_workspaces() -> None:
    cargo = tomllib.loads((Path(__file__).resolve().parents[2] / "Cargo.toml").read_text())
    assert ferrolock.__version__ == cargo["workspace"]["package"]["version"]
