"""Anthropic tool_use blocks to native steps, and the tool_result blocks that answer them (checked against
the ``anthropic`` SDK's ``BetaToolResultBlockParam``)."""

from __future__ import annotations

from typing import Any

import pytest
from anthropic.types.beta import BetaToolUseBlock

from corral.errors import ActionError, ErrorCode
from corral.protocol import ActionResult, EncodedImage, Plan
from corral.protocol import actions as a
from corral.protocol.vendor import anthropic_tools, call_of, failure_result, success_result

from ..conftest import FailFn, PlanFn
from ..wired import result_of
from .sdk import checked_tool_result

PNG = EncodedImage("image/png", b"\x89PNG-fake", 1280, 800)


def block(name: str, inp: dict[str, Any], toolset: str | None = None, id_: str = "toolu_01") -> dict[str, Any]:
    """A tool_use block exactly as the SDK's model dumps it (``caller`` and ``toolset_name`` None included)."""
    return BetaToolUseBlock(id=id_, name=name, input=inp, type="tool_use", toolset_name=toolset).model_dump()


def member(name: str, inp: dict[str, Any]) -> dict[str, Any]:
    return block(name, inp, toolset="computer")


def natives(p: Plan) -> list[dict[str, Any]]:
    return [step.action.model_dump(mode="json", exclude_defaults=True) for step in p.steps]


# -- translation ---------------------------------------------------------------------------------------------------


def test_the_computer_tool_goes_through_todays_translator(plan: PlanFn) -> None:
    p = plan(
        {"id": 1, "anthropic": block("computer", {"action": "left_click", "coordinate": [10, 20], "text": "ctrl"})}
    )
    assert natives(p) == [{"type": "click", "x": 10, "y": 20, "modifiers": ["ctrl"]}]
    assert p.call is not None and p.call.computer
    assert p.after.screenshot is not None and p.after.wait_for_stable  # a computer action's result is the screen
    cursor = plan({"anthropic": block("computer", {"action": "cursor_position"})})
    assert cursor.after.screenshot is None


MEMBERS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("key", {"text": "ctrl+s"}, {"type": "key", "keys": "ctrl+s"}),
    ("key", {"text": "Return", "repeat": 3}, {"type": "key", "keys": "Return", "repeat": 3}),
    ("hold_key", {"text": "shift", "duration": 2}, {"type": "key", "keys": "shift", "hold_ms": 2000}),
    ("type", {"text": "héllo"}, {"type": "type", "text": "héllo"}),
    ("cursor_position", {}, {"type": "cursor_position"}),
    ("mouse_move", {"coordinate": [5, 6]}, {"type": "move", "x": 5, "y": 6}),
    ("left_mouse_down", {}, {"type": "mouse_down"}),
    ("left_mouse_up", {}, {"type": "mouse_up"}),
    ("left_click", {"coordinate": [1, 2]}, {"type": "click", "x": 1, "y": 2}),
    ("left_click", {}, {"type": "click"}),
    (
        "left_click_drag",
        {"start_coordinate": [1, 2], "coordinate": [30, 40], "text": "alt"},
        {"type": "drag", "path": [{"x": 1, "y": 2}, {"x": 30, "y": 40}], "modifiers": ["alt"]},
    ),
    ("right_click", {"coordinate": [1, 2]}, {"type": "click", "button": "right", "x": 1, "y": 2}),
    ("middle_click", {}, {"type": "click", "button": "middle"}),
    (
        "double_click",
        {"coordinate": [3, 4], "text": "shift"},
        {"type": "click", "count": 2, "x": 3, "y": 4, "modifiers": ["shift"]},
    ),
    ("triple_click", {}, {"type": "click", "count": 3}),
    (
        "scroll",
        {"scroll_direction": "down", "scroll_amount": 5, "coordinate": [100, 100]},
        {"type": "scroll", "direction": "down", "clicks": 5, "x": 100, "y": 100},
    ),
    ("wait", {"duration": 1}, {"type": "wait"}),
    ("screenshot", {}, {"type": "screenshot"}),
]


@pytest.mark.parametrize(("name", "inp", "native"), MEMBERS, ids=[f"{m[0]}-{i}" for i, m in enumerate(MEMBERS)])
def test_each_computer_toolset_member(plan: PlanFn, name: str, inp: dict[str, Any], native: dict[str, Any]) -> None:
    p = plan({"id": 1, "anthropic": member(name, inp)})
    assert natives(p) == [native]
    assert p.call is not None and p.call.member and p.call.toolset_name == "computer"


@pytest.mark.parametrize(
    ("region", "width"),
    [
        ([0, 0, 320, 200], 1280),  # same aspect as the 1280x800 screen: scaled 4x to fill it
        ([100, 100, 200, 500], 200),  # tall: the height fills 800, aspect kept
        ([0, 0, 1280, 800], 1280),
    ],
)
def test_zoom_fills_the_image_budget(plan: PlanFn, region: list[int], width: int) -> None:
    p = plan({"anthropic": member("zoom", {"region": region})})
    (zoom,) = [step.action for step in p.steps]
    assert isinstance(zoom, a.Zoom) and zoom.width == width
    assert zoom.region == a.Region(x=region[0], y=region[1], width=region[2] - region[0], height=region[3] - region[1])
    assert p.after.screenshot is None  # the zoom's own image is the reply's


def test_zoom_fills_the_declared_display(plan: PlanFn) -> None:
    p = plan({"anthropic": member("zoom", {"region": [0, 0, 64, 40]}), "display": {"width": 640, "height": 400}})
    (zoom,) = [step.action for step in p.steps]
    assert isinstance(zoom, a.Zoom) and zoom.width == 640  # the model's image budget: the screen it sees
    assert zoom.region == a.Region(x=0, y=0, width=128, height=80)  # on the real 1280x800 screen


@pytest.mark.parametrize(
    ("name", "inp", "code", "field"),
    [
        ("scroll", {"scroll_direction": "down"}, ErrorCode.MISSING_FIELD, "anthropic.input.scroll_amount"),
        ("type", {"text": "x", "coordinate": [1, 1]}, ErrorCode.UNKNOWN_FIELD, "anthropic.input.coordinate"),
        ("mouse_move", {}, ErrorCode.MISSING_FIELD, "anthropic.input.coordinate"),
        ("left_click", {"coordinate": [5000, 1]}, ErrorCode.OUT_OF_BOUNDS, "anthropic.input.coordinate"),
        ("key", {"text": "nosuchkey"}, ErrorCode.UNKNOWN_KEY, "anthropic.input.text"),
        ("key", {"text": "a", "repeat": 0}, ErrorCode.INVALID_FIELD, "anthropic.input.repeat"),
        ("zoom", {"region": [10, 10, 5, 5]}, ErrorCode.INVALID_FIELD, "anthropic.input.region"),
    ],
)
def test_a_member_with_the_wrong_input(
    fail: FailFn, name: str, inp: dict[str, Any], code: ErrorCode, field: str
) -> None:
    error = fail({"anthropic": member(name, inp)})
    assert (error.code, error.field) == (code, field)


@pytest.mark.parametrize(
    "raw",
    [
        block("left_click", {}),  # a member without toolset_name "computer"
        block("screenshot", {}, toolset="browser"),
        block("navigate", {"url": "x"}, toolset="computer"),  # no such member
        block("web_search", {"query": "x"}),
    ],
)
def test_a_tool_corral_does_not_serve(fail: FailFn, raw: dict[str, Any]) -> None:
    error = fail({"anthropic": raw})
    assert (error.code, error.field) == (ErrorCode.UNKNOWN_TOOL, "anthropic.name")
    assert repr(raw["name"]) in error.message


def test_bash(plan: PlanFn) -> None:
    p = plan({"anthropic": block("bash", {"command": "cd /tmp && ls"})})
    # stderr apart: the reference bash tool marks a result that has any as an error.
    assert natives(p) == [{"type": "shell", "command": "cd /tmp && ls", "split_stderr": True}]
    assert p.call is not None and not p.call.computer
    assert p.after.screenshot is None and not p.after.wait_for_stable
    restart = natives(plan({"anthropic": block("bash", {"restart": True})}))
    assert restart == [{"type": "shell", "restart": True, "split_stderr": True}]
    # agent_toolset_20260401's bash: timeout_ms, where 0 is the default.
    timed = plan(
        {"anthropic": block("bash", {"command": "make", "timeout_ms": 5000}, toolset="agent_toolset_20260401")}
    )
    assert natives(timed) == [{"type": "shell", "command": "make", "timeout_ms": 5000, "split_stderr": True}]
    default = plan({"anthropic": block("bash", {"command": "make", "timeout_ms": 0})})
    assert natives(default) == [{"type": "shell", "command": "make", "split_stderr": True}]


def test_bash_asked_for_a_screenshot_gets_one(plan: PlanFn) -> None:
    p = plan({"anthropic": block("bash", {"command": "xclock &"}), "screenshot": True})
    assert p.after.screenshot == a.ScreenshotOptions()


@pytest.mark.parametrize(
    ("inp", "code", "field"),
    [
        ({}, ErrorCode.MISSING_FIELD, "anthropic.input"),
        ({"command": "ls", "cwd": "/"}, ErrorCode.UNKNOWN_FIELD, "anthropic.input.cwd"),
        ({"command": 5}, ErrorCode.INVALID_FIELD, "anthropic.input.command"),
        ({"command": "ls", "timeout_ms": -1}, ErrorCode.INVALID_FIELD, "anthropic.input.timeout_ms"),
    ],
)
def test_bash_with_the_wrong_input(fail: FailFn, inp: dict[str, Any], code: ErrorCode, field: str) -> None:
    error = fail({"anthropic": block("bash", inp)})
    assert (error.code, error.field) == (code, field)


def test_bash_without_a_command_says_so_in_the_references_words(fail: FailFn) -> None:
    assert fail({"anthropic": block("bash", {})}).message == "no command provided."


@pytest.mark.parametrize(
    ("data", "text", "is_error"),
    [
        ({"output": "", "stderr": "bash: nope: command not found\n"}, "bash: nope: command not found\n", True),
        ({"output": "made", "stderr": "warning: x\n"}, "made\nwarning: x\n", True),  # stdout kept before it
        ({"output": "a\n", "stderr": ""}, "a\n", False),
        ({"output": "", "stderr": "", "exit_code": 1}, None, False),  # a non-zero exit alone is no error
    ],
)
def test_a_bash_result_with_stderr_is_an_error_as_the_reference_marks_it(
    plan: PlanFn, data: dict[str, Any], text: str | None, is_error: bool
) -> None:
    p = plan({"anthropic": block("bash", {"command": "x"})})
    full = {"exit_code": 0, "truncated": False, "restarted": False, **data}
    out = result_for(p, [result_of(full)])
    assert out["content"] == ([{"type": "text", "text": text}] if text else [])
    assert out.get("is_error", False) is is_error


EDITS: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({"command": "view", "path": "/workspace/a.py"}, {"command": "view", "path": "/workspace/a.py"}),
    ({"command": "view", "path": "/w/a.py", "view_range": []}, {"command": "view", "path": "/w/a.py"}),  # the reference
    (
        {"command": "view", "path": "/w/a.py", "view_range": [3, -1], "max_characters": 100},
        {"command": "view", "path": "/w/a.py", "view_range": [3, -1], "max_characters": 100},
    ),
    (
        {"command": "create", "path": "/w/n.txt", "file_text": "hi\n"},
        {"command": "create", "path": "/w/n.txt", "file_text": "hi\n"},
    ),
    (
        {"command": "str_replace", "path": "/w/a", "old_str": "x", "new_str": "y"},
        {"command": "str_replace", "path": "/w/a", "old_str": "x", "new_str": "y"},
    ),
    (
        {"command": "str_replace", "path": "/w/a", "old_str": "x"},
        {"command": "str_replace", "path": "/w/a", "old_str": "x"},
    ),
    (
        {"command": "insert", "path": "/w/a", "insert_line": 0, "new_str": "top"},
        {"command": "insert", "path": "/w/a", "insert_line": 0, "new_str": "top"},
    ),
    (
        {"command": "insert", "path": "/w/a", "insert_line": 2, "insert_text": "models send this"},
        {"command": "insert", "path": "/w/a", "insert_line": 2, "new_str": "models send this"},
    ),
    ({"command": "view", "path": "relative.txt"}, {"command": "view", "path": "relative.txt"}),  # the editor refuses it
]


@pytest.mark.parametrize("name", ["str_replace_based_edit_tool", "str_replace_editor"])
@pytest.mark.parametrize(("inp", "native"), EDITS)
def test_the_text_editors(plan: PlanFn, name: str, inp: dict[str, Any], native: dict[str, Any]) -> None:
    p = plan({"anthropic": block(name, inp)})
    assert natives(p) == [{"type": "edit", **native}]
    assert p.after.screenshot is None


def test_undo_edit_only_in_text_editor_20250124(plan: PlanFn, fail: FailFn) -> None:
    undo = {"command": "undo_edit", "path": "/w/a"}
    assert natives(plan({"anthropic": block("str_replace_editor", undo)})) == [{"type": "edit", **undo}]
    error = fail({"anthropic": block("str_replace_based_edit_tool", undo)})
    assert (error.code, error.field) == (ErrorCode.INVALID_FIELD, "anthropic.input.command")
    assert "undo_edit" in error.message


@pytest.mark.parametrize(
    ("inp", "message", "field"),
    [
        ({"command": "create", "path": "/w/a"}, "Parameter `file_text` is required for command: create", "file_text"),
        (
            {"command": "str_replace", "path": "/w/a"},
            "Parameter `old_str` is required for command: str_replace",
            "old_str",
        ),
        (
            {"command": "insert", "path": "/w/a", "new_str": "x"},
            "Parameter `insert_line` is required for command: insert",
            "insert_line",
        ),
        (
            {"command": "insert", "path": "/w/a", "insert_line": 1},
            "Parameter `new_str` is required for command: insert",
            "new_str",
        ),
    ],
)
def test_the_editor_names_a_missing_parameter_as_the_reference_does(
    fail: FailFn, inp: dict[str, Any], message: str, field: str
) -> None:
    error = fail({"anthropic": block("str_replace_based_edit_tool", inp)})
    assert (error.code, error.message, error.field) == (ErrorCode.MISSING_FIELD, message, f"anthropic.input.{field}")


@pytest.mark.parametrize(
    ("inp", "code", "field"),
    [
        ({"command": "rename", "path": "/w/a"}, ErrorCode.INVALID_FIELD, "anthropic.input.command"),
        ({"command": "view"}, ErrorCode.MISSING_FIELD, "anthropic.input.path"),
        ({"command": "view", "path": "/w/a", "view_range": [1]}, ErrorCode.INVALID_FIELD, "anthropic.input.view_range"),
        (
            {"command": "insert", "path": "/w/a", "insert_line": -1, "insert_text": "x"},
            ErrorCode.INVALID_FIELD,
            "anthropic.input.insert_line",
        ),
        ({"command": "view", "path": "/w/a", "bogus": 1}, ErrorCode.UNKNOWN_FIELD, "anthropic.input.bogus"),
    ],
)
def test_the_editor_with_the_wrong_input(fail: FailFn, inp: dict[str, Any], code: ErrorCode, field: str) -> None:
    error = fail({"anthropic": block("str_replace_editor", inp)})
    assert (error.code, error.field) == (code, field)


AGENT: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "edit",
        {"file_path": "src/a.py", "old_string": "x", "new_string": "y"},
        {"type": "edit", "command": "str_replace", "path": "/workspace/src/a.py", "old_str": "x", "new_str": "y"},
    ),
    (
        "edit",
        {"file_path": "/etc/a", "old_string": "x", "new_string": "y", "replace_all": True},
        {
            "type": "edit",
            "command": "str_replace",
            "path": "/etc/a",
            "old_str": "x",
            "new_str": "y",
            "replace_all": True,
        },
    ),
    ("read", {"file_path": "a.txt"}, {"type": "edit", "command": "view", "path": "/workspace/a.txt"}),
    (
        "read",
        {"file_path": "a.txt", "view_range": [2, 0]},  # end <= 0: to the end of the file
        {"type": "edit", "command": "view", "path": "/workspace/a.txt", "view_range": [2, -1]},
    ),
    (
        "read",
        {"file_path": "a.txt", "view_range": [2, 9]},
        {"type": "edit", "command": "view", "path": "/workspace/a.txt", "view_range": [2, 9]},
    ),
    (
        "write",
        {"file_path": "deep/new.txt", "content": "data"},
        {"type": "file_write", "path": "/workspace/deep/new.txt", "content": "data", "make_dirs": True},
    ),
    ("glob", {"pattern": "**/*.py"}, {"type": "file_glob", "pattern": "**/*.py"}),
    ("glob", {"pattern": "*.md", "path": "docs"}, {"type": "file_glob", "pattern": "*.md", "path": "/workspace/docs"}),
    ("grep", {"pattern": "TODO"}, {"type": "file_grep", "pattern": "TODO"}),
    ("grep", {"pattern": "def ", "path": "/srv"}, {"type": "file_grep", "pattern": "def ", "path": "/srv"}),
]


@pytest.mark.parametrize("toolset", [None, "agent_toolset_20260401"])
@pytest.mark.parametrize(("name", "inp", "native"), AGENT)
def test_the_agent_toolsets_file_tools(
    plan: PlanFn, toolset: str | None, name: str, inp: dict[str, Any], native: dict[str, Any]
) -> None:
    p = plan({"anthropic": block(name, inp, toolset=toolset)})
    assert natives(p) == [native]
    assert p.call is not None and p.call.toolset_name == toolset


@pytest.mark.parametrize(
    ("name", "inp", "code", "field"),
    [
        ("edit", {"file_path": "a", "old_string": "x"}, ErrorCode.MISSING_FIELD, "anthropic.input.new_string"),
        ("read", {"file_path": "a", "view_range": [1, 2, 3]}, ErrorCode.INVALID_FIELD, "anthropic.input.view_range"),
        ("write", {"file_path": "a"}, ErrorCode.MISSING_FIELD, "anthropic.input.content"),
        ("write", {"file_path": "a\x00b", "content": ""}, ErrorCode.INVALID_FIELD, "anthropic.input.file_path"),
        ("glob", {"path": "x"}, ErrorCode.MISSING_FIELD, "anthropic.input.pattern"),
        ("grep", {"pattern": ""}, ErrorCode.INVALID_FIELD, "anthropic.input.pattern"),
    ],
)
def test_the_agent_tools_with_the_wrong_input(
    fail: FailFn, name: str, inp: dict[str, Any], code: ErrorCode, field: str
) -> None:
    error = fail({"anthropic": block(name, inp)})
    assert (error.code, error.field) == (code, field)


def test_a_block_that_is_not_one(fail: FailFn) -> None:
    error = fail({"anthropic": {"type": "tool_use", "id": "t", "name": "bash"}})
    assert (error.code, error.field) == (ErrorCode.MISSING_FIELD, "anthropic.input")
    assert fail({"anthropic": {"type": "tool_use", "name": "bash", "input": {}}}).field == "anthropic.id"


def test_todays_bare_computer_input_is_unchanged(plan: PlanFn) -> None:
    p = plan({"anthropic": {"action": "left_click", "coordinate": [1, 2]}})
    assert p.call is None and natives(p) == [{"type": "click", "x": 1, "y": 2}]


# -- tool_result blocks --------------------------------------------------------------------------------------------


def result_for(p: Plan, results: list[ActionResult], image: EncodedImage | None = None) -> dict[str, Any]:
    assert p.call is not None
    result, error = success_result(p.call, p.steps, results, image, p.scale)
    assert error is None and list(result) == ["tool_result"]
    return checked_tool_result(result["tool_result"])


def test_a_computer_tool_result_is_its_screenshot(plan: PlanFn) -> None:
    p = plan({"anthropic": block("computer", {"action": "left_click", "coordinate": [1, 2]})})
    out = result_for(p, [result_of({})], PNG)
    assert list(out) == ["type", "tool_use_id", "content"]
    assert out["tool_use_id"] == "toolu_01"
    assert out["content"] == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORy1mYWtl"}}
    ]


def test_a_member_echoes_its_toolset(plan: PlanFn) -> None:
    p = plan({"anthropic": member("cursor_position", {})})
    out = result_for(p, [result_of({"x": 3, "y": 4})])
    assert out == {
        "type": "tool_result",
        "tool_use_id": "toolu_01",
        "content": [{"type": "text", "text": "X=3,Y=4"}],
        "toolset_name": "computer",
    }
    zoom = plan({"anthropic": member("zoom", {"region": [0, 0, 10, 10]})})
    zoomed = result_for(zoom, [result_of({}, PNG)], PNG)
    assert [c["type"] for c in zoomed["content"]] == ["image"] and zoomed["toolset_name"] == "computer"


@pytest.mark.parametrize(
    ("raw", "data", "text"),
    [
        (
            block("bash", {"command": "ls"}),
            {"output": "a\nb\n", "exit_code": 0, "truncated": False, "restarted": False},
            "a\nb\n",
        ),
        (
            block("bash", {"restart": True}),
            {"output": "tool has been restarted.", "exit_code": None, "truncated": False, "restarted": True},
            "tool has been restarted.",
        ),
        (
            block("str_replace_editor", {"command": "view", "path": "/w/a"}),
            {"output": "     1\thi", "path": "/w/a"},
            "     1\thi",
        ),
        (block("read", {"file_path": "a"}), {"output": "     1\thi", "path": "/workspace/a"}, "     1\thi"),
        (
            block("edit", {"file_path": "a", "old_string": "x", "new_string": "y"}),
            {"output": "The file /workspace/a has been edited.", "path": "/workspace/a"},
            "The file /workspace/a has been edited.",
        ),
        (
            block("write", {"file_path": "a", "content": "abc"}),
            {"path": "/workspace/a", "size": 3, "sha256": "x"},
            "Wrote 3 bytes to /workspace/a",
        ),
        (
            block("glob", {"pattern": "*"}),
            {"paths": ["/workspace/b", "/workspace/a"], "truncated": False},
            "/workspace/b\n/workspace/a",
        ),
        (block("glob", {"pattern": "*"}), {"paths": [], "truncated": False}, "No files found"),
        (block("glob", {"pattern": "*"}), {"paths": ["/x"], "truncated": True}, "/x\n(results truncated)"),
        (
            block("grep", {"pattern": "x"}),
            {"matches": [{"path": "/w/a", "line": 3, "text": "x = 1"}], "truncated": False},
            "/w/a:3:x = 1",
        ),
        (block("grep", {"pattern": "x"}), {"matches": [], "truncated": False}, "No matches found"),
    ],
)
def test_tool_results_carry_the_tools_text(plan: PlanFn, raw: dict[str, Any], data: dict[str, Any], text: str) -> None:
    out = result_for(plan({"anthropic": raw}), [result_of(data)])
    assert out == {"type": "tool_result", "tool_use_id": "toolu_01", "content": [{"type": "text", "text": text}]}


def test_no_output_is_no_text_block(plan: PlanFn) -> None:
    # The Messages API refuses an empty text block; the reference tools send none.
    p = plan({"anthropic": block("bash", {"command": "true"})})
    out = result_for(p, [result_of({"output": "", "exit_code": 0, "truncated": False, "restarted": False})])
    assert out["content"] == []


def test_a_screenshot_asked_for_comes_after_the_text(plan: PlanFn) -> None:
    p = plan({"anthropic": block("bash", {"command": "ls"}), "screenshot": True})
    out = result_for(p, [result_of({"output": "a"})], PNG)
    assert [c["type"] for c in out["content"]] == ["text", "image"]


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (
            block("bash", {"command": "sleep 999"}),
            ActionError(ErrorCode.TIMEOUT, "timed out after 120 s; the shell was restarted"),
        ),
        (
            block("str_replace_based_edit_tool", {"command": "str_replace", "path": "/w/a", "old_str": "q"}),
            ActionError(
                ErrorCode.NO_MATCH, "No replacement was performed, old_str `q` did not appear verbatim in /w/a."
            ),
        ),
        (
            block("nope", {}),
            ActionError(ErrorCode.UNKNOWN_TOOL, "Corral does not serve the tool 'nope'", "anthropic.name"),
        ),
        (
            member("left_click", {"coordinate": [1]}),
            ActionError(ErrorCode.INVALID_FIELD, "bad coordinate", "anthropic.input.coordinate"),
        ),
    ],
)
def test_a_failure_is_an_is_error_tool_result(raw: dict[str, Any], error: ActionError) -> None:
    call = call_of({"anthropic": raw})
    assert call is not None
    result = failure_result(call, error)
    assert result is not None and list(result) == ["tool_result"]
    out = checked_tool_result(result["tool_result"])
    expected: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": "toolu_01",
        "content": [{"type": "text", "text": error.message}],
        "is_error": True,
    }
    if raw["toolset_name"] is not None:
        expected["toolset_name"] = raw["toolset_name"]
    assert out == expected


def test_the_member_fields_are_the_sdks() -> None:
    # Each BetaComputer*Input model's fields, as the translator accepts them.
    from anthropic.types import beta

    for name, fields in anthropic_tools.MEMBER_FIELDS.items():
        model = getattr(beta, "BetaComputer" + "".join(part.title() for part in name.split("_")) + "Input")
        assert set(model.model_fields) == fields, name


def test_an_unknown_member_name_says_it_needs_the_toolset(fail: FailFn) -> None:
    assert "only with toolset_name 'computer'" in fail({"anthropic": block("left_click", {})}).message
    assert "toolset_name" not in fail({"anthropic": block("web_search", {})}).message


def test_a_failure_with_an_empty_message_has_no_empty_text_block() -> None:
    call = call_of({"anthropic": block("bash", {"command": "x"})})
    assert call is not None
    result = failure_result(call, ActionError(ErrorCode.INTERNAL, ""))["tool_result"]
    assert result["content"] == [] and result["is_error"] is True
    checked_tool_result(result)
