"""ARCHITECTURE.md's module table keeps up with the package: every module has its row (its own or
its package's), and no module has two."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "services" / "corral"


def _named_in_rows() -> list[str]:
    """The modules each row's first column names (a row may name several: `a`, `b`)."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    firsts = re.findall(r"^\| (.+?) \|", text, re.MULTILINE)
    return [name for first in firsts for name in re.findall(r"`([a-z0-9_.]+)`", first)]


def _modules() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in ("__init__.py", "__main__.py"):
            continue
        found.append(".".join(path.relative_to(PACKAGE).with_suffix("").parts))
    return found


def test_every_module_has_a_row() -> None:
    named = set(_named_in_rows())

    def covered(module: str) -> bool:
        parts = module.split(".")
        return any(".".join(parts[:end]) in named for end in range(1, len(parts) + 1))

    assert [module for module in _modules() if not covered(module)] == []


def test_no_module_has_two_rows() -> None:
    assert [name for name, rows in Counter(_named_in_rows()).items() if rows > 1] == []
