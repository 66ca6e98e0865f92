"""The vendors' own reference cases for Corral's apply_patch, text editor and bash tool, as data (README.md
says where each came from, at which commit, under which licence), and what the runners share: reading
the cases, splitting a whole codex patch into the one-file operations the Responses API hands Corral,
and the table of cases Corral deliberately does otherwise (``expected_differences.json``).

The runners: tests/unit/protocol/test_vendor_reference.py (pure, against corral.protocol.v4a) and
tests/integration/test_vendor_reference.py (the file-touching cases in a real sandbox, as the agent).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

HERE = Path(__file__).parent
SCENARIOS = HERE / "codex" / "scenarios"

BEGIN, END = "*** Begin Patch", "*** End Patch"
ADD, DELETE, UPDATE, MOVE = "*** Add File: ", "*** Delete File: ", "*** Update File: ", "*** Move to: "
END_OF_FILE = "*** End of File"

Kind = Literal["create_file", "update_file", "delete_file"]


@dataclass(frozen=True)
class Operation:
    """One file's part of a codex patch, as an ``apply_patch_call`` carries it: ``diff`` is what
    Corral is handed (a ``*** Move to:`` line kept in it: Corral is the one to refuse it)."""

    kind: Kind
    path: str
    diff: str


class PatchRefused(Exception):
    """The patch's envelope is not a patch (codex's parse error): nothing is applied."""


def load(name: str) -> Any:
    return json.loads((HERE / name).read_text(encoding="utf-8"))


def differences(suite: str) -> dict[str, str]:
    """The cases of ``suite`` that Corral deliberately does otherwise, each with the reason."""
    table: dict[str, dict[str, str]] = load("expected_differences.json")
    return table[suite]


def holds(suite: str, case: str, matched: bool, detail: str) -> None:
    """``matched`` (the reference's result) unless the table lists the case, then the opposite."""
    reason = differences(suite).get(case)
    if reason is None:
        assert matched, f"{suite} {case} does not give the reference's result: {detail}"
    else:
        assert not matched, f"{suite} {case} now gives the reference's result: take it out of the table ({reason})"


def prepared(patch: str, root: str) -> list[Operation]:
    """``patch``'s operations with their paths under ``root`` (absolute, as Corral takes them), every
    part read by Corral's parser first: a malformed one
    raises (``PatchRefused`` or corral's ``ActionError``) and nothing is to be applied, as codex's
    parser refuses the whole patch."""
    from corral.protocol import v4a

    operations = split_patch(patch.replace("{root}", root))
    for operation in operations:
        if operation.kind == "create_file":
            v4a.parse_create(operation.diff)
        elif operation.kind == "update_file":
            v4a.parse_update(operation.diff)
    return [
        Operation(
            operation.kind,
            operation.path if operation.path.startswith("/") else f"{root}/{operation.path}",
            operation.diff,
        )
        for operation in operations
    ]


def split_patch(patch: str) -> list[Operation]:
    """A whole codex patch as its one-file operations, in order. The envelope's rules are codex's
    parser.rs (markers trimmed, a hunk header trimmed, an Add File taking the ``+`` lines that
    follow it, an Update File running to the next line that starts with ``***``); what is inside a
    file's part is left for Corral to judge."""
    lines = patch.strip().splitlines()
    if not lines or lines[0].strip() != BEGIN:
        raise PatchRefused("The first line of the patch must be '*** Begin Patch'")
    if lines[-1].strip() != END or len(lines) < 2:
        raise PatchRefused("The last line of the patch must be '*** End Patch'")
    body = lines[1:-1]
    out: list[Operation] = []
    index = 0
    while index < len(body):
        header = body[index].strip()
        index += 1
        if header.startswith(ADD):
            added: list[str] = []
            while index < len(body) and body[index].startswith("+"):
                added.append(body[index])
                index += 1
            out.append(Operation("create_file", header[len(ADD) :], "".join(f"{line}\n" for line in added)))
        elif header.startswith(DELETE):
            out.append(Operation("delete_file", header[len(DELETE) :], ""))
        elif header.startswith(UPDATE):
            part: list[str] = []
            while index < len(body) and not (body[index].startswith("***") and not _is_move_or_eof(body[index], part)):
                part.append(body[index])
                index += 1
            out.append(Operation("update_file", header[len(UPDATE) :], "".join(f"{line}\n" for line in part)))
        elif header == "":
            continue
        else:
            raise PatchRefused(f"{header!r} is not a valid hunk header")
    return out


def _is_move_or_eof(line: str, part: list[str]) -> bool:
    """A ``***`` line that belongs to an Update File's part: its ``*** Move to:`` (first) or an
    ``*** End of File`` (closing a chunk)."""
    return (not part and line.startswith(MOVE)) or line.strip() == END_OF_FILE


def read_tree(root: Path) -> dict[str, str]:
    """The files under ``root`` (relative path: text), as a scenario's input/ or expected/ holds them."""
    if not root.is_dir():
        return {}
    return {
        path.relative_to(root).as_posix(): path.read_bytes().decode()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def scenario_names() -> list[str]:
    return sorted(path.name for path in SCENARIOS.iterdir() if path.is_dir())


def scenario(name: str) -> tuple[dict[str, str], str, dict[str, str]]:
    """A codex scenario: its input files, its patch, the files expected after it."""
    folder = SCENARIOS / name
    patch = (folder / "patch.txt").read_bytes().decode()
    return read_tree(folder / "input"), patch, read_tree(folder / "expected")
