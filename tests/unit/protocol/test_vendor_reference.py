"""The vendors' own reference cases (tests/vendor_reference), every one of them, replayed through Corral:
codex's apply-patch scenarios and unit tests, openai-agents-python's apply_diff tests. A case Corral
does otherwise must be in expected_differences.json with its reason, and a case listed there must
still differ: the table can neither hide a regression nor outlive a fix.

The text cases run against corral.protocol.v4a alone; the file cases (codex's scenarios and lib.rs
tests) run through the real Patcher, Editor and AgentFiles over the unit seam's AgentFs (plain os
calls as the test's uid: tests/integration/test_vendor_reference.py runs them as the agent)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import vendor_reference as ref
from corral.errors import ActionError
from corral.protocol import actions as a
from corral.protocol import v4a
from corral.sandbox.tools.editor import Editor
from corral.sandbox.tools.files import AgentFiles
from corral.sandbox.tools.patch import Patcher

from ..sandbox.fakefs import FakeAgentFs

CODEX = ref.load("codex/unit_cases.json")
AGENTS = ref.load("openai-agents-python/apply_diff_cases.json")


def _case_ids(cases: list[dict[str, Any]]) -> list[str]:
    return [case["id"] for case in cases]


_holds = ref.holds


# -- a whole codex patch over files -------------------------------------------------------------------------


async def apply_patch(root: Path, patch: str) -> str | None:
    """``patch`` applied under ``root`` as Corral applies it, one apply_patch action per file: every
    part read first (a malformed one: nothing is applied, as codex's parser), then each in turn until
    one fails (what was done stays, as codex's). The error, or None."""
    fs = FakeAgentFs()
    patcher = Patcher(Editor(AgentFiles(fs, workspace=str(root)), fs), fs)
    try:
        operations = ref.prepared(patch, str(root))
    except (ref.PatchRefused, ActionError) as exc:
        return str(exc)
    for operation in operations:
        action = a.ApplyPatch(type="apply_patch", operation=operation.kind, path=operation.path, diff=operation.diff)
        try:
            await patcher.run(action)
        except ActionError as exc:
            return exc.message
    return None


def _write_tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(text.encode())


@pytest.mark.parametrize("name", ref.scenario_names())
async def test_codex_scenario(tmp_path: Path, name: str) -> None:
    given, patch, expected = ref.scenario(name)
    _write_tree(tmp_path, given)
    error = await apply_patch(tmp_path, patch)
    got = ref.read_tree(tmp_path)
    _holds("codex/scenarios", name, got == expected, f"{got!r} != {expected!r} (error: {error})")


@pytest.mark.parametrize("case", CODEX["apply"], ids=_case_ids(CODEX["apply"]))
async def test_codex_unit_apply(tmp_path: Path, case: dict[str, Any]) -> None:
    _write_tree(tmp_path, case["files"])
    for name in case.get("read_only", []):
        (tmp_path / name).chmod(0o444)  # (this test's root is not stopped by it: the integration runner's agent is)
    error = await apply_patch(tmp_path, case["patch"])
    got = ref.read_tree(tmp_path)
    _holds("codex/unit_cases", case["id"], got == case["expected"], f"{got!r} (error: {error})")


def _parsed(patch: str) -> list[dict[str, Any]] | str:
    """A whole patch as Corral reads it: each file's operation, or the error."""
    try:
        out: list[dict[str, Any]] = []
        for operation in ref.split_patch(patch):
            if operation.kind == "create_file":
                out.append({"op": "add", "path": operation.path, "contents": v4a.parse_create(operation.diff)})
            elif operation.kind == "delete_file":
                out.append({"op": "delete", "path": operation.path})
            else:
                chunks = [
                    {
                        "context": [*chunk.outer, *([] if chunk.header is None else [chunk.header])],
                        "old": list(chunk.old),
                        "new": list(chunk.new),
                        "eof": chunk.end_of_file,
                    }
                    for chunk in v4a.parse_update(operation.diff)
                ]
                out.append({"op": "update", "path": operation.path, "chunks": chunks})
        return out
    except (ref.PatchRefused, ActionError):
        return "error"


@pytest.mark.parametrize("case", CODEX["parse"], ids=_case_ids(CODEX["parse"]))
def test_codex_unit_parse(case: dict[str, Any]) -> None:
    got = _parsed(case["patch"])
    _holds("codex/unit_cases", case["id"], got == case["expect"], f"{got!r}")


@pytest.mark.parametrize("case", CODEX["seek"], ids=_case_ids(CODEX["seek"]))
def test_codex_unit_seek(case: dict[str, Any]) -> None:
    got = v4a.seek(case["lines"], tuple(case["pattern"]), case["start"], case["eof"])
    _holds("codex/unit_cases", case["id"], got == case["expect"], f"{got!r}")


# -- openai-agents-python's apply_diff -----------------------------------------------------------------------


def _apply_diff(case: dict[str, Any]) -> str | dict[str, bool]:
    try:
        if case["mode"] == "create":
            return v4a.parse_create(case["diff"])
        return v4a.apply_update(case["input"], case["diff"])
    except ActionError:
        return {"error": True}


@pytest.mark.parametrize("case", AGENTS["cases"], ids=_case_ids(AGENTS["cases"]))
def test_agents_apply_diff(case: dict[str, Any]) -> None:
    got = _apply_diff(case)
    _holds("openai-agents-python/apply_diff_cases", case["id"], got == case["expect"], f"{got!r}")


# -- the data accounts for every reference test, and the table for real cases only ---------------------------

# Each suite's original test files (under original/), and whether its case ids carry the file's stem
# (codex's: "lib.test_x", "parser.test_x").
ORIGINALS: dict[str, tuple[list[str], bool]] = {
    "codex/unit_cases": (["codex/lib.rs.txt", "codex/parser.rs.txt", "codex/seek_sequence.rs.txt"], True),
    "openai-agents-python/apply_diff_cases": (
        ["openai-agents-python/test_apply_diff.py.txt", "openai-agents-python/test_apply_diff_helpers.py.txt"],
        False,
    ),
    "anthropic-quickstarts/edit_cases": (["anthropic-quickstarts/edit_test.py.txt"], False),
    "anthropic-quickstarts/bash_cases": (["anthropic-quickstarts/bash_test.py.txt"], False),
}
TEST_NAME = re.compile(r"(?:fn|def) (test_\w+)\(")


def _suite_ids(suite: str) -> tuple[set[str], set[str]]:
    """The case ids of ``suite`` (run), and the reference tests it names as not run."""
    data = ref.load(f"{suite}.json")
    cases = [case for key in ("apply", "parse", "seek", "cases") for case in data.get(key, [])]
    return {case["id"] for case in cases}, set(data.get("not_run", {}))


@pytest.mark.parametrize("suite", sorted(ORIGINALS))
def test_every_reference_test_is_a_case_or_said_why_not(suite: str) -> None:
    files, stemmed = ORIGINALS[suite]
    run, not_run = _suite_ids(suite)
    found = 0
    for name in files:
        stem = name.split("/")[-1].split(".")[0] + "." if stemmed else ""
        for test in TEST_NAME.findall((ref.HERE / "original" / name).read_text()):
            found += 1
            wanted = f"{stem}{test}"
            covered = wanted in not_run or any(case == wanted or case.startswith(f"{wanted}#") for case in run)
            assert covered, f"{suite}: the reference's {test} ({name}) is neither a case nor listed as not run"
    assert found >= 5, f"{suite}: {found} reference tests found; is the original there?"


def test_the_difference_table_names_real_cases_with_reasons() -> None:
    table: dict[str, dict[str, str]] = ref.load("expected_differences.json")
    for suite, listed in table.items():
        known = set(ref.scenario_names()) if suite == "codex/scenarios" else _suite_ids(suite)[0]
        for case, reason in listed.items():
            assert case in known, f"{suite}: {case} is not one of its cases"
            assert len(reason) > 40, f"{suite}: {case} needs its reason"
