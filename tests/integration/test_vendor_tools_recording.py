"""A session driven with the vendors' blocks (bash, the editor, apply_patch, shell_call) is recorded
as it was asked: the blocks verbatim, the native actions they became, the vendor replies; and
``corral replay`` of the recording passes against a fresh sandbox."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.recording.bundle import read_bundle
from corral.sdk import Sandbox

from .dockerutil import DockerHarness
from .gateway_fixtures import KEY_A, RunningGateway, module_gateway, replay_cli, unpack_recording
from .vendor_fixtures import apply_patch_call, item, shell_call, tool_result, tool_use

pytestmark = pytest.mark.usefixtures("desktop_image")

BLOCKS: list[tuple[str, dict[str, Any], bool]] = [
    (
        "anthropic",
        tool_use("bash", {"command": "mkdir -p /workspace/rec && cd /workspace/rec && echo hi > a.txt"}),
        True,
    ),
    ("anthropic", tool_use("bash", {"command": "pwd; cat a.txt"}), True),
    (
        "anthropic",
        tool_use("str_replace_editor", {"command": "create", "path": "/workspace/rec/b.py", "file_text": "x = 1\n"}),
        True,
    ),
    (
        "anthropic",
        tool_use(
            "str_replace_based_edit_tool",
            {"command": "str_replace", "path": "/workspace/rec/b.py", "old_str": "x = 1", "new_str": "x = 2"},
        ),
        True,
    ),
    (
        "anthropic",
        tool_use(
            "str_replace_based_edit_tool",
            {"command": "str_replace", "path": "/workspace/rec/b.py", "old_str": "absent", "new_str": "y"},
        ),
        False,
    ),
    ("openai", apply_patch_call("create_file", "rec/c.txt", "+one\n+two\n"), True),
    ("openai", apply_patch_call("update_file", "rec/c.txt", "@@\n one\n-two\n+TWO\n"), True),
    ("openai", shell_call("cat rec/c.txt", "python3 rec/b.py; cat rec/b.py"), True),
]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[RunningGateway]:
    with module_gateway(tmp_path_factory, runtime, "it-vendor-rec", egress=False) as running:
        yield running


@pytest.fixture(scope="module")
def recorded(gw: RunningGateway, tmp_path_factory: pytest.TempPathFactory) -> Path:
    with Sandbox.create(url=gw.url, api_key=KEY_A) as sb:
        for dialect, call, ok in BLOCKS:
            reply = sb.request({dialect: call})
            if dialect == "anthropic":
                tool_result(reply, call, ok=ok)
            else:
                item(reply, call, ok=ok)
        assert sb.files.read("/workspace/rec/c.txt") == b"one\nTWO\n"
        session_id = sb.id
    target = tmp_path_factory.mktemp("recorded-vendor")
    return unpack_recording(gw, session_id, target, lambda bundle: len(bundle.actions) >= len(BLOCKS))


def test_the_recording_holds_the_blocks_the_natives_and_the_vendor_replies(recorded: Path) -> None:
    *actions, last = read_bundle(recorded).actions
    assert len(actions) == len(BLOCKS), [a.get("request") for a in actions]
    assert last["native"][0]["type"] == "file_read"  # the check at the end
    natives = []
    for event, (dialect, call, ok) in zip(actions, BLOCKS, strict=True):
        assert event["request"][dialect] == call, event["request"]
        assert event["dialect"] == dialect and event["ok"] is ok, event
        natives.append([step["type"] for step in event["native"] or []])
        key = "tool_result" if dialect == "anthropic" else "item"
        assert key in event["reply"]["result"], event["reply"]
    assert natives[:5] == [["shell"], ["shell"], ["edit"], ["edit"], ["edit"]], natives
    assert natives[5:7] == [["apply_patch"], ["apply_patch"]] and natives[7] == ["exec", "exec"], natives
    assert actions[4]["error"]["code"] == "no_match"


@pytest.fixture(scope="module")
def replayed(gw: RunningGateway, recorded: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, str]:
    """``corral replay`` of the recording against the gateway, once: exit code, JUnit XML, HTML report."""
    return replay_cli(gw, recorded, tmp_path_factory.mktemp("replayed"))


def test_the_recording_replays_against_a_fresh_sandbox(replayed: tuple[int, str, str]) -> None:
    code, junit, report = replayed
    assert code == 0, report
    assert f'tests="{len(BLOCKS) + 1}"' in junit and 'failures="0"' in junit, junit


def test_the_replay_judges_each_tool_step_by_its_result(replayed: tuple[int, str, str]) -> None:
    """A replay judges every vendor-driven step: corral.recording.judge once knew exec and the file
    actions only, so a shell, edit or apply_patch step was judged by its frame, had none, and was
    skipped, and a shell_call's exec steps compared the exit code of a reply that has none at the top
    level (its outcomes are in result.item)."""
    code, junit, report = replayed
    assert code == 0, report
    assert 'skipped="0"' in junit, junit
    assert "exit code matches: none" not in junit, junit
