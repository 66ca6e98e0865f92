"""docs/mcp.md's tool table against the server's own tool table (corral.mcp.ANNOTATIONS): every tool,
in order, with its annotations as the server lists them; and no count of tools in the prose that a new
tool would make wrong."""

from __future__ import annotations

import re
from pathlib import Path

from corral.mcp import ANNOTATIONS

DOC = Path(__file__).resolve().parents[3] / "docs" / "mcp.md"
HEADER = "| tool | read only | destructive | idempotent | open world | what it does |"


def documented() -> list[tuple[str, tuple[bool, bool, bool, bool]]]:
    """The table's rows: a tool's name and its four annotations (yes/no) as the doc gives them."""
    lines = DOC.read_text().splitlines()
    start = lines.index(HEADER) + 2  # the header and its rule
    rows: list[tuple[str, tuple[bool, bool, bool, bool]]] = []
    for line in lines[start:]:
        if not line.startswith("| `"):
            break
        cells = [cell.strip() for cell in line.strip("|").split(" | ")]
        assert all(cell in ("yes", "no") for cell in cells[1:5]), line
        flags = tuple(cell == "yes" for cell in cells[1:5])
        rows.append((cells[0].strip("`"), (flags[0], flags[1], flags[2], flags[3])))
    return rows


def test_the_tool_table_is_the_servers() -> None:
    served = [
        (name, (h.read_only_hint is True, h.destructive_hint is True, h.idempotent_hint is True, h.open_world_hint))
        for name, h in ANNOTATIONS.items()
    ]
    assert documented() == served


def test_no_count_of_tools_in_the_prose() -> None:
    # "21 tools" went stale as tools were added; the table is the list.
    counts = re.findall(r"\b(\d+) tools\b", DOC.read_text())
    assert counts == [], counts
