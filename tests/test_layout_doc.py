"""docs/layout.md draws the package as it is: every top-level module and package is in it, and
every module it names exists."""

from __future__ import annotations

import re
from pathlib import Path

import gateway

ROOT = Path(gateway.__file__).parent
LAYOUT = ROOT.parent / "docs" / "layout.md"


def tree_block() -> str:
    """The fenced block that starts with `gateway/`."""
    text = LAYOUT.read_text()
    blocks = re.findall(r"```\n(.*?)```", text, re.S)
    [block] = [b for b in blocks if b.startswith("gateway/")]
    return block


def test_every_top_level_module_and_package_is_drawn() -> None:
    block = tree_block()
    named = set(re.findall(r"[\w/]+\.py|\b\w+/", block))
    modules = {p.name for p in ROOT.glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    packages = {f"{p.name}/" for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    packages.add("ui/")  # static files, not a Python package
    missing = sorted((modules | packages) - named)
    assert not missing, f"docs/layout.md does not draw {missing}"


def test_every_module_drawn_exists() -> None:
    files = {p.name for p in ROOT.rglob("*.py")}
    named = set(re.findall(r"(\w+\.py)", tree_block()))
    gone = sorted(named - files)
    assert not gone, f"docs/layout.md names modules that do not exist: {gone}"
