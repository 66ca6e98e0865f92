"""Anthropic's computer tool (computer_20250124 / computer_20251124) to native actions and back."""

from __future__ import annotations

import base64
from typing import Any, get_args

import pytest
from pydantic import TypeAdapter

from corral.errors import ActionError, ErrorCode
from corral.protocol import EncodedImage, NativeAction, Scale, Size, anthropic
from corral.protocol import actions as a

from .conftest import FailFn, PlanFn
from .wired import result_of

ADAPTER: TypeAdapter[NativeAction] = TypeAdapter(NativeAction)
FIELD = "anthropic"


def native(data: dict[str, Any]) -> NativeAction:
    return ADAPTER.validate_python(data)


def translate(raw: Any) -> list[NativeAction]:
    return anthropic.translate(raw, FIELD)


def rejected(raw: Any) -> ActionError:
    with pytest.raises(ActionError) as info:
        anthropic.translate(raw, FIELD)
    return info.value


@pytest.mark.parametrize(
    ("tool_input", "expected"),
    [
        ({"action": "key", "text": "Return"}, {"type": "key", "keys": "Return"}),
        ({"action": "key", "text": "ctrl+shift+t"}, {"type": "key", "keys": "ctrl+shift+t"}),
        ({"action": "key", "text": "ctrl+a BackSpace"}, {"type": "key", "keys": "ctrl+a BackSpace"}),
        ({"action": "type", "text": "Hello, world!\n"}, {"type": "type", "text": "Hello, world!\n"}),
        ({"action": "type", "text": ""}, {"type": "type", "text": ""}),
        ({"action": "mouse_move", "coordinate": [100, 200]}, {"type": "move", "x": 100, "y": 200}),
        (
            {"action": "left_click", "coordinate": [10, 20]},
            {"type": "click", "button": "left", "count": 1, "x": 10, "y": 20},
        ),
        ({"action": "left_click"}, {"type": "click", "button": "left", "count": 1}),
        (
            {"action": "right_click", "coordinate": [5, 6]},
            {"type": "click", "button": "right", "count": 1, "x": 5, "y": 6},
        ),
        (
            {"action": "middle_click", "coordinate": [5, 6]},
            {"type": "click", "button": "middle", "count": 1, "x": 5, "y": 6},
        ),
        (
            {"action": "double_click", "coordinate": [7, 8]},
            {"type": "click", "button": "left", "count": 2, "x": 7, "y": 8},
        ),
        (
            {"action": "triple_click", "coordinate": [7, 8]},
            {"type": "click", "button": "left", "count": 3, "x": 7, "y": 8},
        ),
        (
            {"action": "left_click_drag", "start_coordinate": [1, 2], "coordinate": [30, 40]},
            {"type": "drag", "path": [{"x": 1, "y": 2}, {"x": 30, "y": 40}]},
        ),
        ({"action": "left_mouse_down"}, {"type": "mouse_down", "button": "left"}),
        ({"action": "left_mouse_down", "coordinate": [3, 4]}, {"type": "mouse_down", "button": "left", "x": 3, "y": 4}),
        ({"action": "left_mouse_up"}, {"type": "mouse_up", "button": "left"}),
        ({"action": "left_mouse_up", "coordinate": [9, 9]}, {"type": "mouse_up", "button": "left", "x": 9, "y": 9}),
        (
            {"action": "scroll", "coordinate": [50, 60], "scroll_direction": "down", "scroll_amount": 3},
            {"type": "scroll", "x": 50, "y": 60, "direction": "down", "clicks": 3},
        ),
        (
            {"action": "scroll", "scroll_direction": "left", "scroll_amount": 1},
            {"type": "scroll", "direction": "left", "clicks": 1},
        ),
        (
            {"action": "scroll", "coordinate": [1, 1], "scroll_direction": "up", "scroll_amount": 200},
            {"type": "scroll", "x": 1, "y": 1, "direction": "up", "clicks": 200},
        ),
        (
            {"action": "scroll", "coordinate": [1, 1], "scroll_direction": "right", "scroll_amount": 0},
            {"type": "wait", "ms": 0},
        ),
        ({"action": "hold_key", "text": "shift", "duration": 1.5}, {"type": "key", "keys": "shift", "hold_ms": 1500}),
        ({"action": "hold_key", "text": "ctrl+a", "duration": 0}, {"type": "key", "keys": "ctrl+a", "hold_ms": 0}),
        ({"action": "hold_key", "text": "a", "duration": 10}, {"type": "key", "keys": "a", "hold_ms": 10_000}),
        ({"action": "wait", "duration": 2}, {"type": "wait", "ms": 2000}),
        ({"action": "wait", "duration": 0.25}, {"type": "wait", "ms": 250}),
        ({"action": "wait", "duration": 0.0004}, {"type": "wait", "ms": 0}),
        ({"action": "wait", "duration": 60}, {"type": "wait", "ms": 60_000}),
        ({"action": "cursor_position"}, {"type": "cursor_position"}),
        ({"action": "screenshot"}, {"type": "screenshot"}),
        (
            {"action": "zoom", "region": [10, 20, 110, 70]},
            {"type": "zoom", "region": {"x": 10, "y": 20, "width": 100, "height": 50}},
        ),
        (
            {"action": "zoom", "region": [0, 0, 1, 1]},
            {"type": "zoom", "region": {"x": 0, "y": 0, "width": 1, "height": 1}},
        ),
    ],
)
def test_translate(tool_input: dict[str, Any], expected: dict[str, Any]) -> None:
    assert translate(tool_input) == [native(expected)]


def test_every_tool_action_is_covered() -> None:
    # Against the Anthropic SDK's own list of the computer tool's actions, not a copy of it.
    from anthropic.types import ComputerMemberName

    assert set(get_args(anthropic.AnthropicActionName)) == set(get_args(ComputerMemberName))


@pytest.mark.parametrize("action", ["key", "type", "mouse_move", "left_click", "zoom", "screenshot", "cursor_position"])
def test_unrelated_fields_are_ignored(action: str) -> None:
    # Models send fields an action does not use (coordinate with key, text with screenshot...).
    base: dict[str, Any] = {
        "key": {"text": "a"},
        "type": {"text": "a"},
        "mouse_move": {"coordinate": [1, 1]},
        "left_click": {},
        "zoom": {"region": [0, 0, 4, 4]},
        "screenshot": {},
        "cursor_position": {},
    }[action]
    extra = {"scroll_direction": "up", "duration": 1}
    assert translate({"action": action, **base, **extra}) == translate({"action": action, **base})


# Modifiers held during pointer actions: in `text` (computer_20250124) or `key` (newer tool versions).


@pytest.mark.parametrize("field", ["text", "key"])
@pytest.mark.parametrize(
    ("held", "modifiers"),
    [
        ("shift", ["shift"]),
        ("ctrl+shift", ["ctrl", "shift"]),
        ("cmd", ["cmd"]),
        ("Control_L+Alt_L", ["Control_L", "Alt_L"]),
        ("ctrl+", ["ctrl"]),
        ("", []),
    ],
)
@pytest.mark.parametrize("action", ["left_click", "right_click", "middle_click", "double_click", "triple_click"])
def test_click_modifiers(field: str, held: str, modifiers: list[str], action: str) -> None:
    [click] = translate({"action": action, "coordinate": [1, 2], field: held})
    assert isinstance(click, a.Click)
    assert click.modifiers == modifiers


@pytest.mark.parametrize("field", ["text", "key"])
def test_drag_and_scroll_modifiers(field: str) -> None:
    [drag] = translate({"action": "left_click_drag", "start_coordinate": [0, 0], "coordinate": [5, 5], field: "shift"})
    [scroll] = translate(
        {"action": "scroll", "coordinate": [5, 5], "scroll_direction": "down", "scroll_amount": 2, field: "ctrl"}
    )
    assert isinstance(drag, a.Drag) and drag.modifiers == ["shift"]
    assert isinstance(scroll, a.Scroll) and scroll.modifiers == ["ctrl"]


def test_text_wins_over_key_for_modifiers() -> None:
    [click] = translate({"action": "left_click", "coordinate": [1, 1], "text": "alt", "key": "shift"})
    assert isinstance(click, a.Click)
    assert click.modifiers == ["alt"]


@pytest.mark.parametrize(
    ("tool_input", "field"),
    [
        ({"action": "left_click", "coordinate": [1, 1], "text": "a"}, "anthropic.text"),
        ({"action": "left_click", "coordinate": [1, 1], "key": "a"}, "anthropic.key"),
        ({"action": "left_click", "coordinate": [1, 1], "text": "ctrl+bogus"}, "anthropic.text"),
        ({"action": "double_click", "coordinate": [1, 1], "key": "shift+Return"}, "anthropic.key"),
        ({"action": "scroll", "scroll_direction": "up", "scroll_amount": 1, "key": "x"}, "anthropic.key"),
        (
            {"action": "left_click_drag", "start_coordinate": [0, 0], "coordinate": [1, 1], "key": "Tab"},
            "anthropic.key",
        ),
    ],
)
def test_bad_modifiers_name_the_field_they_came_in(tool_input: dict[str, Any], field: str) -> None:
    err = rejected(tool_input)
    assert (err.code, err.field) == (ErrorCode.UNKNOWN_KEY, field)


# Bad input.


@pytest.mark.parametrize(
    ("tool_input", "code", "field"),
    [
        ("left_click", ErrorCode.INVALID_FIELD, "anthropic"),
        (None, ErrorCode.INVALID_FIELD, "anthropic"),
        ({}, ErrorCode.MISSING_FIELD, "anthropic.action"),
        ({"action": "fly"}, ErrorCode.INVALID_FIELD, "anthropic.action"),
        ({"action": "left_click", "bogus": 1}, ErrorCode.UNKNOWN_FIELD, "anthropic.bogus"),
        # Missing fields per action.
        ({"action": "key"}, ErrorCode.MISSING_FIELD, "anthropic.text"),
        ({"action": "key", "key": "Return"}, ErrorCode.MISSING_FIELD, "anthropic.text"),
        ({"action": "type"}, ErrorCode.MISSING_FIELD, "anthropic.text"),
        ({"action": "mouse_move"}, ErrorCode.MISSING_FIELD, "anthropic.coordinate"),
        ({"action": "left_click_drag", "coordinate": [1, 1]}, ErrorCode.MISSING_FIELD, "anthropic.start_coordinate"),
        ({"action": "left_click_drag", "start_coordinate": [1, 1]}, ErrorCode.MISSING_FIELD, "anthropic.coordinate"),
        ({"action": "scroll", "scroll_amount": 3}, ErrorCode.MISSING_FIELD, "anthropic.scroll_direction"),
        ({"action": "scroll", "scroll_direction": "up"}, ErrorCode.MISSING_FIELD, "anthropic.scroll_amount"),
        ({"action": "hold_key", "text": "shift"}, ErrorCode.MISSING_FIELD, "anthropic.duration"),
        ({"action": "hold_key", "duration": 1}, ErrorCode.MISSING_FIELD, "anthropic.text"),
        ({"action": "wait"}, ErrorCode.MISSING_FIELD, "anthropic.duration"),
        ({"action": "zoom"}, ErrorCode.MISSING_FIELD, "anthropic.region"),
        # Malformed values.
        ({"action": "mouse_move", "coordinate": [1]}, ErrorCode.MISSING_FIELD, "anthropic.coordinate[1]"),
        ({"action": "mouse_move", "coordinate": [1, 2, 3]}, ErrorCode.INVALID_FIELD, "anthropic.coordinate"),
        ({"action": "mouse_move", "coordinate": "1,2"}, ErrorCode.INVALID_FIELD, "anthropic.coordinate"),
        ({"action": "mouse_move", "coordinate": ["a", 2]}, ErrorCode.INVALID_FIELD, "anthropic.coordinate[0]"),
        ({"action": "mouse_move", "coordinate": [1, 100_001]}, ErrorCode.INVALID_FIELD, "anthropic.coordinate"),
        ({"action": "left_click", "coordinate": [-100_001, 1]}, ErrorCode.INVALID_FIELD, "anthropic.coordinate"),
        (
            {"action": "left_click_drag", "start_coordinate": [-100_001, 0], "coordinate": [1, 1]},
            ErrorCode.INVALID_FIELD,
            "anthropic.start_coordinate",
        ),
        (
            {"action": "left_click_drag", "start_coordinate": [0, 0], "coordinate": [1, 100_001]},
            ErrorCode.INVALID_FIELD,
            "anthropic.coordinate",
        ),
        ({"action": "key", "text": "ctrl+bogus"}, ErrorCode.UNKNOWN_KEY, "anthropic.text"),
        ({"action": "key", "text": ""}, ErrorCode.INVALID_FIELD, "anthropic.text"),
        ({"action": "hold_key", "text": "Retrun", "duration": 1}, ErrorCode.UNKNOWN_KEY, "anthropic.text"),
        ({"action": "type", "text": "a" * 20_001}, ErrorCode.TEXT_TOO_LONG, "anthropic.text"),
        ({"action": "type", "text": "bell\x07"}, ErrorCode.INVALID_FIELD, "anthropic.text"),
        (
            {"action": "scroll", "scroll_direction": "sideways", "scroll_amount": 1},
            ErrorCode.INVALID_FIELD,
            "anthropic.scroll_direction",
        ),
        (
            {"action": "scroll", "scroll_direction": "up", "scroll_amount": -1},
            ErrorCode.INVALID_FIELD,
            "anthropic.scroll_amount",
        ),
        (
            {"action": "scroll", "scroll_direction": "up", "scroll_amount": 201},
            ErrorCode.INVALID_FIELD,
            "anthropic.scroll_amount",
        ),
        ({"action": "hold_key", "text": "a", "duration": 10.001}, ErrorCode.INVALID_FIELD, "anthropic.duration"),
        ({"action": "wait", "duration": -1}, ErrorCode.INVALID_FIELD, "anthropic.duration"),
        ({"action": "wait", "duration": 61}, ErrorCode.INVALID_FIELD, "anthropic.duration"),
        ({"action": "wait", "duration": 101}, ErrorCode.INVALID_FIELD, "anthropic.duration"),
        ({"action": "zoom", "region": [0, 0, 10]}, ErrorCode.MISSING_FIELD, "anthropic.region[3]"),
        ({"action": "zoom", "region": [10, 0, 10, 10]}, ErrorCode.INVALID_FIELD, "anthropic.region"),
        ({"action": "zoom", "region": [0, 10, 10, 5]}, ErrorCode.INVALID_FIELD, "anthropic.region"),
    ],
)
def test_bad_input(tool_input: Any, code: ErrorCode, field: str) -> None:
    err = rejected(tool_input)
    assert (err.code, err.field) == (code, field)
    assert err.message


def test_missing_field_message_names_action_and_field() -> None:
    err = rejected({"action": "left_click_drag", "coordinate": [1, 1]})
    assert err.message == "'left_click_drag' needs 'start_coordinate'"


def test_a_different_prefix_is_used_in_paths() -> None:
    with pytest.raises(ActionError) as info:
        anthropic.translate({"action": "key"}, "input")
    assert info.value.field == "input.text"


# Bounds, through plan_request: errors name what the model sent.


@pytest.mark.parametrize(
    ("tool_input", "field", "where"),
    [
        ({"action": "left_click", "coordinate": [1280, 0]}, "anthropic.coordinate", "(1280, 0)"),
        ({"action": "mouse_move", "coordinate": [0, 800]}, "anthropic.coordinate", "(0, 800)"),
        ({"action": "left_mouse_down", "coordinate": [-1, 0]}, "anthropic.coordinate", "(-1, 0)"),
        (
            {"action": "scroll", "coordinate": [5000, 5], "scroll_direction": "up", "scroll_amount": 1},
            "anthropic.coordinate",
            "(5000, 5)",
        ),
        (
            {"action": "left_click_drag", "start_coordinate": [-5, 0], "coordinate": [1, 1]},
            "anthropic.start_coordinate",
            "(-5, 0)",
        ),
        (
            {"action": "left_click_drag", "start_coordinate": [0, 0], "coordinate": [1, 900]},
            "anthropic.coordinate",
            "(1, 900)",
        ),
        ({"action": "zoom", "region": [1000, 0, 1281, 10]}, "anthropic.region", "1000,0 281x10"),
    ],
)
def test_out_of_bounds(fail: FailFn, tool_input: dict[str, Any], field: str, where: str) -> None:
    err = fail({"anthropic": tool_input})
    assert (err.code, err.field) == (ErrorCode.OUT_OF_BOUNDS, field)
    assert where in err.message


def test_edges_are_on_screen(plan: PlanFn) -> None:
    p = plan({"anthropic": {"action": "left_click_drag", "start_coordinate": [0, 0], "coordinate": [1279, 799]}})
    assert p.steps[0].action == native({"type": "drag", "path": [{"x": 0, "y": 0}, {"x": 1279, "y": 799}]})
    assert p.steps[0].field == "anthropic"


@pytest.mark.parametrize(
    ("action", "wants"),
    [
        ("cursor_position", False),
        ("left_click", True),
        ("key", True),
        ("screenshot", True),
        ("zoom", True),
        ("wait", True),
        ("None", True),
    ],
)
def test_wants_screenshot(action: str, wants: bool) -> None:
    assert anthropic.wants_screenshot(action) is wants


# tool_result_content.

PNG = EncodedImage("image/png", b"\x89PNG fake bytes", 1024, 640)


def test_result_with_an_image() -> None:
    blocks = anthropic.tool_result_content(native({"type": "click"}), result_of({}), PNG, None)
    assert blocks == [
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(PNG.data).decode()},
        }
    ]
    assert base64.b64decode(blocks[0]["source"]["data"]) == PNG.data


def test_result_image_keeps_its_media_type() -> None:
    jpeg = EncodedImage("image/jpeg", b"\xff\xd8\xff", 8, 8)
    [block] = anthropic.tool_result_content(native({"type": "screenshot"}), result_of({}), jpeg, None)
    assert block["source"]["media_type"] == "image/jpeg"


def test_result_without_an_image_is_empty() -> None:
    assert anthropic.tool_result_content(native({"type": "wait"}), result_of({}), None, None) == []


@pytest.mark.parametrize(
    ("screen_xy", "scale", "text"),
    [
        ((640, 400), None, "X=640,Y=400"),
        ((0, 0), None, "X=0,Y=0"),
        ((640, 400), Scale(screen=Size(1280, 800), display=Size(1024, 640)), "X=512,Y=320"),
        ((1279, 799), Scale(screen=Size(1280, 800), display=Size(1024, 640)), "X=1023,Y=639"),
        ((125, 50), Scale(screen=Size(1280, 800), display=Size(1024, 640)), "X=100,Y=40"),
        ((100, 100), Scale(screen=Size(1280, 800), display=Size(640, 400)), "X=50,Y=50"),
    ],
)
def test_cursor_position_text(screen_xy: tuple[int, int], scale: Scale | None, text: str) -> None:
    result = result_of({"x": screen_xy[0], "y": screen_xy[1]})
    blocks = anthropic.tool_result_content(native({"type": "cursor_position"}), result, None, scale)
    assert blocks == [{"type": "text", "text": text}]


def test_cursor_position_text_comes_before_an_image() -> None:
    result = result_of({"x": 3, "y": 4})
    blocks = anthropic.tool_result_content(native({"type": "cursor_position"}), result, PNG, None)
    assert [b["type"] for b in blocks] == ["text", "image"]
    assert blocks[0]["text"] == "X=3,Y=4"
