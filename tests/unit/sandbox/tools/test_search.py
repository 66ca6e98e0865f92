"""file_glob (doublestar, over the AgentFs seam) and file_grep (ripgrep's argv and its --json read
back; the process table is stood in for)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from corral.errors import ActionError, ErrorCode
from corral.protocol import actions as a
from corral.protocol import results as r
from corral.sandbox.agent.processes import RunContext
from corral.sandbox.tools.files import AgentFiles
from corral.sandbox.tools.search import Search, glob_matcher, grep_argv, grep_matches

from ..fakefs import FakeAgentFs


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("**/*.py", "a.py", True),
        ("**/*.py", "x/y/a.py", True),
        ("**/*.py", "a.pyc", False),
        ("*.py", "x/a.py", False),
        ("src/**/test_*.py", "src/test_a.py", True),
        ("src/**/test_*.py", "src/u/v/test_a.py", True),
        ("src/**", "src/u/v", True),
        ("?.txt", "a.txt", True),
        ("?.txt", "ab.txt", False),
        ("*.{js,ts}", "a.ts", True),
        ("*.{js,ts}", "a.rs", False),
        ("[ab].c", "b.c", True),
        ("[!ab].c", "b.c", False),
        ("a+b(1).txt", "a+b(1).txt", True),
    ],
)
def test_doublestar(pattern: str, path: str, matches: bool) -> None:
    assert bool(glob_matcher(pattern).match(path)) is matches


def test_an_unclosed_brace_is_an_invalid_pattern() -> None:
    with pytest.raises(ActionError) as raised:
        glob_matcher("*.{js")
    assert (raised.value.code, raised.value.field) == (ErrorCode.INVALID_FIELD, "action.pattern")


def _record(path: str, line: int, text: str) -> str:
    data = {"path": {"text": path}, "lines": {"text": text}, "line_number": line}
    return json.dumps({"type": "match", "data": data})


def test_grep_matches_reads_match_records_and_skips_the_rest() -> None:
    stdout = "\n".join(
        [
            json.dumps({"type": "begin", "data": {"path": {"text": "/w/a"}}}),
            _record("/w/a", 3, "TODO one\n"),
            json.dumps(
                {"type": "match", "data": {"path": {"bytes": "L3cvYv8="}, "lines": {"bytes": "eP8K"}, "line_number": 1}}
            ),
            '{"type":"match","data":{"path":',  # cut by the output bound
        ]
    )
    found, more = grep_matches(stdout, 10)
    matches = [match.wire() for match in found]
    assert matches == [
        {"path": "/w/a", "line": 3, "text": "TODO one"},
        {"path": "/w/b\ufffd", "line": 1, "text": "x\ufffd"},
    ]
    assert more is False
    first, more = grep_matches(stdout, 1)
    assert ([match.wire() for match in first], more) == ([{"path": "/w/a", "line": 3, "text": "TODO one"}], True)


def test_grep_argv_is_an_argv_with_the_pattern_as_an_option_value() -> None:
    action = a.FileGrep(type="file_grep", pattern="-rf /", glob="*.py", ignore_case=True)
    options = ["--regexp", "-rf /", "--ignore-case", "--glob", "*.py"]
    assert grep_argv(action, "/workspace") == [
        "/usr/bin/rg",
        "--json",
        "--no-config",
        "--no-messages",
        *options,
        "--",
        "/workspace",
    ]


class FakeProcesses:
    def __init__(self, result: dict[str, Any]) -> None:
        self.result = result
        self.actions: list[a.Exec] = []

    async def exec(self, action: a.Exec, context: RunContext) -> r.ExecResult:
        """A foreground exec's result: the scripted fields, the rest as a command that ended by itself."""
        self.actions.append(action)
        ended = {"pid": 9, "exit_code": 0, "signal": None, "oom_killed": False, "duration_ms": 1.0, "stdout": ""}
        ended |= {"stdout_truncated": False, "stderr": "", "stderr_truncated": False, "timed_out": False}
        return r.ExecResult(r.ExecFinished.model_validate({**ended, "encoding": "utf-8", **self.result}))


async def wired(search: Search, action: a.FileGlob | a.FileGrep, context: RunContext) -> dict[str, Any]:
    """The search's result as the reply carries it."""
    return (await search.run(action, context)).wire()


def _search(root: Path, result: dict[str, Any] | None = None) -> tuple[Search, FakeProcesses]:
    processes = FakeProcesses(result or {"exit_code": 1, "stdout": "", "stderr": ""})
    return Search(AgentFiles(FakeAgentFs(), workspace=str(root)), processes), processes  # type: ignore[arg-type]


async def test_glob_is_relative_to_path_newest_first_and_bounded(tmp_path: Path) -> None:
    for age, name in enumerate(["new.py", "sub/mid.py", "sub/deep/old.py", "notes.txt"]):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
        os.utime(tmp_path / name, (1_000_000 - age, 1_000_000 - age))
    search, _ = _search(tmp_path)
    found = await wired(search, a.FileGlob(type="file_glob", pattern="**/*.py", path=str(tmp_path)), RunContext("1"))
    assert found == {
        "paths": [f"{tmp_path}/{n}" for n in ("new.py", "sub/mid.py", "sub/deep/old.py")],
        "truncated": False,
    }
    cut = await wired(
        search, a.FileGlob(type="file_glob", pattern="**/*.py", path=str(tmp_path), limit=1), RunContext("1")
    )
    assert cut == {"paths": [f"{tmp_path}/new.py"], "truncated": True}


async def test_glob_does_not_follow_a_symlink_out(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "secret").mkdir(parents=True)
    (outside / "secret" / "key.py").write_text("")
    (tmp_path / "w").mkdir()
    os.symlink(outside, tmp_path / "w" / "link")
    search, _ = _search(tmp_path)
    found = await wired(
        search, a.FileGlob(type="file_glob", pattern="**/*.py", path=str(tmp_path / "w")), RunContext("1")
    )
    assert found["paths"] == []
    links = await wired(search, a.FileGlob(type="file_glob", pattern="link", path=str(tmp_path / "w")), RunContext("1"))
    assert links["paths"] == [f"{tmp_path}/w/link"]  # the link itself, as a name


async def test_grep_runs_rg_as_an_argv_and_reads_its_json(tmp_path: Path) -> None:
    search, processes = _search(
        tmp_path, {"exit_code": 0, "stdout": _record(f"{tmp_path}/a", 2, "x TODO\n"), "stderr": ""}
    )
    found = await wired(search, a.FileGrep(type="file_grep", pattern="TODO", path=str(tmp_path)), RunContext("1"))
    assert found == {"matches": [{"path": f"{tmp_path}/a", "line": 2, "text": "x TODO"}], "truncated": False}
    (action,) = processes.actions
    assert action.argv is not None and action.argv[0] == "/usr/bin/rg" and action.command is None


async def test_a_bad_regex_is_an_invalid_field_with_rgs_message(tmp_path: Path) -> None:
    stderr = "regex parse error:\n    a(\n     ^\nerror: unclosed group\n"
    search, _ = _search(tmp_path, {"exit_code": 2, "stdout": "", "stderr": stderr})
    with pytest.raises(ActionError) as raised:
        await search.run(a.FileGrep(type="file_grep", pattern="a(", path=str(tmp_path)), RunContext("1"))
    assert (raised.value.code, raised.value.field) == (ErrorCode.INVALID_FIELD, "action.pattern")
    assert "unclosed group" in raised.value.message


async def test_grep_of_a_missing_path_is_no_such_file(tmp_path: Path) -> None:
    search, processes = _search(tmp_path)
    with pytest.raises(ActionError) as raised:
        await search.run(a.FileGrep(type="file_grep", pattern="x", path=str(tmp_path / "nope")), RunContext("1"))
    assert raised.value.code == ErrorCode.NO_SUCH_FILE and processes.actions == []


async def test_grep_of_a_directory_the_agent_cannot_list_is_permission_denied(tmp_path: Path) -> None:
    fs = FakeAgentFs()
    fs.denied.add(str(tmp_path))
    processes = FakeProcesses({"exit_code": 2, "stdout": "", "stderr": ""})
    search = Search(AgentFiles(fs, workspace=str(tmp_path)), processes)  # type: ignore[arg-type]
    with pytest.raises(ActionError) as raised:
        await search.run(a.FileGrep(type="file_grep", pattern="x", path=str(tmp_path)), RunContext("1"))
    assert (raised.value.code, raised.value.field) == (ErrorCode.PERMISSION_DENIED, "action.path")
    assert processes.actions == []


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("src/**", "src", False),
        ("**", "a/b/c", True),
        ("a/**/b/**/c", "a/b/c", True),
        ("a/**/b/**/c", "a/x/b/y/z/c", True),
        ("a/**/b/**/c", "a/x/y/c", False),
        ("*.{js,{ts,tsx}}", "a.tsx", True),
        ("[a-c]?.*", "bz.q", True),
        ("[a-c]?.*", "dz.q", False),
        ("*a*b", "xaxxb", True),
        ("*a*b", "xaxxbc", False),
        ("/abs/*.py", "/abs/x.py", True),
    ],
)
def test_doublestar_segments_classes_and_nested_braces(pattern: str, path: str, matches: bool) -> None:
    assert glob_matcher(pattern).match(path) is matches


def test_a_pathological_pattern_does_polynomial_work() -> None:
    # As a regex ([^/]* per *), this pattern backtracked exponentially: 14 s on a 60-character name.
    glob = glob_matcher("*a" * 7 + "*b")
    name = "a" * 60
    assert glob.match(name) is False
    assert glob.steps <= len(name) * len(glob.pattern)


def test_brace_expansions_are_capped() -> None:
    with pytest.raises(ActionError) as raised:
        glob_matcher("{a,b}" * 9)  # 512 patterns
    assert (raised.value.code, raised.value.field) == (ErrorCode.INVALID_FIELD, "action.pattern")


def test_grep_matches_skips_records_without_ripgreps_shape() -> None:
    hostile = [
        '{"type":"match","data":{}}',
        '{"type":"match","data":[1]}',
        '{"type":"match","data":{"lines":{"bytes":"!!"},"path":{"text":"x"},"line_number":1}}',
        '{"type":"match","data":{"lines":{"text":"t"},"path":{"text":"x"},"line_number":"1"}}',
        '["match"]',
        _record("ok.txt", 3, "fine\n"),
    ]
    found, more = grep_matches("\n".join(hostile), 10)
    assert ([match.wire() for match in found], more) == ([{"path": "ok.txt", "line": 3, "text": "fine"}], False)
