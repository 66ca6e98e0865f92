"""OpenAI computer-use actions (single and batched) to native actions, and the call output."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from pydantic import TypeAdapter

from corral.errors import ActionError, ErrorCode
from corral.protocol import EncodedImage, NativeAction, openai
from corral.protocol import actions as a

from .conftest import FailFn, PlanFn

ADAPTER: TypeAdapter[NativeAction] = TypeAdapter(NativeAction)
FIELD = "openai"


def native(data: dict[str, Any]) -> NativeAction:
    return ADAPTER.validate_python(data)


def one(raw: Any) -> NativeAction:
    return openai.translate_one(raw, FIELD)


def rejected(raw: Any) -> ActionError:
    with pytest.raises(ActionError) as info:
        openai.translate(raw, FIELD)
    return info.value


@pytest.mark.parametrize(
    ("button", "native_button"),
    [("left", "left"), ("right", "right"), ("wheel", "middle"), ("back", "back"), ("forward", "forward")],
)
def test_click_buttons(button: str, native_button: str) -> None:
    assert one({"type": "click", "button": button, "x": 10, "y": 20}) == native(
        {"type": "click", "button": native_button, "x": 10, "y": 20}
    )


def test_click_defaults_to_left() -> None:
    action = one({"type": "click", "x": 1, "y": 2})
    assert isinstance(action, a.Click)
    assert (action.button, action.count, action.modifiers) == ("left", 1, [])


@pytest.mark.parametrize(
    ("oa", "expected"),
    [
        ({"type": "double_click", "x": 5, "y": 6}, {"type": "click", "count": 2, "x": 5, "y": 6}),
        (
            {"type": "drag", "path": [{"x": 1, "y": 2}, {"x": 3, "y": 4}]},
            {"type": "drag", "path": [{"x": 1, "y": 2}, {"x": 3, "y": 4}]},
        ),
        (
            {"type": "drag", "path": [{"x": 0, "y": 0}, {"x": 10, "y": 5}, {"x": 20, "y": 0}, {"x": 30, "y": 30}]},
            {"type": "drag", "path": [{"x": 0, "y": 0}, {"x": 10, "y": 5}, {"x": 20, "y": 0}, {"x": 30, "y": 30}]},
        ),
        ({"type": "move", "x": 100, "y": 200}, {"type": "move", "x": 100, "y": 200}),
        (
            {"type": "scroll", "x": 10, "y": 20, "scroll_x": 0, "scroll_y": 300},
            {"type": "scroll", "x": 10, "y": 20, "dx": 0, "dy": 300},
        ),
        (
            {"type": "scroll", "x": 10, "y": 20, "scroll_x": -50, "scroll_y": 0},
            {"type": "scroll", "x": 10, "y": 20, "dx": -50, "dy": 0},
        ),
        (
            {"type": "scroll", "x": 10, "y": 20, "scroll_y": -120},
            {"type": "scroll", "x": 10, "y": 20, "dx": 0, "dy": -120},
        ),
        ({"type": "scroll", "x": 10, "y": 20, "scroll_x": 0, "scroll_y": 0}, {"type": "move", "x": 10, "y": 20}),
        ({"type": "scroll", "x": 10, "y": 20}, {"type": "move", "x": 10, "y": 20}),
        ({"type": "type", "text": "hello\tworld"}, {"type": "type", "text": "hello\tworld"}),
        ({"type": "type", "text": ""}, {"type": "type", "text": ""}),
        ({"type": "wait"}, {"type": "wait", "ms": 1000}),
        ({"type": "wait", "ms": 250}, {"type": "wait", "ms": 250}),
        ({"type": "wait", "ms": 0}, {"type": "wait", "ms": 0}),
        ({"type": "screenshot"}, {"type": "screenshot"}),
    ],
)
def test_translate_one(oa: dict[str, Any], expected: dict[str, Any]) -> None:
    assert one(oa) == native(expected)


@pytest.mark.parametrize(
    ("keys", "combo"),
    [
        (["CTRL", "C"], "Control_L+c"),
        (["ctrl", "c"], "Control_L+c"),
        (["CTRL", "SHIFT", "T"], "Control_L+Shift_L+t"),
        (["ENTER"], "Return"),
        (["Enter"], "Return"),
        (["ESC"], "Escape"),
        (["ESCAPE"], "Escape"),
        (["SPACE"], "space"),
        (["TAB"], "Tab"),
        (["BACKSPACE"], "BackSpace"),
        (["DELETE"], "Delete"),
        (["ARROWLEFT"], "Left"),
        (["ArrowDown"], "Down"),
        (["PAGEDOWN"], "Next"),
        (["HOME"], "Home"),
        (["F5"], "F5"),
        (["ALT", "F4"], "Alt_L+F4"),
        (["CMD", "A"], "Super_L+a"),
        (["META", "A"], "Meta_L+a"),
        (["SUPER"], "Super_L"),
        (["A"], "a"),
        (["a"], "a"),
        (["Z"], "z"),
        (["1"], "1"),
        (["/"], "/"),
        (["+"], "plus"),
        (["CTRL", "+"], "Control_L+plus"),
        (["+", "CTRL"], "plus+Control_L"),
        (["CTRL", "+", "A"], "Control_L+plus+a"),
        (["CTRL", "SHIFT", "="], "Control_L+Shift_L+="),
    ],
)
def test_keypress(keys: list[str], combo: str) -> None:
    action = one({"type": "keypress", "keys": keys})
    assert isinstance(action, a.Key)
    assert action.keys == combo
    assert str(action.combos()[0]) == combo


def test_keypress_letters_are_not_shifted() -> None:
    action = one({"type": "keypress", "keys": ["A"]})
    assert isinstance(action, a.Key)
    [combo] = action.combos()
    assert [k.keysym for k in combo.keys] == [ord("a")]


@pytest.mark.parametrize(
    "oa",
    [
        {"type": "click", "x": 1, "y": 2},
        {"type": "double_click", "x": 1, "y": 2},
        {"type": "move", "x": 1, "y": 2},
        {"type": "scroll", "x": 1, "y": 2, "scroll_y": 10},
        {"type": "drag", "path": [{"x": 1, "y": 2}, {"x": 3, "y": 4}]},
    ],
)
@pytest.mark.parametrize(
    ("keys", "modifiers"),
    [
        (["SHIFT"], ["Shift_L"]),
        (["CTRL", "ALT"], ["Control_L", "Alt_L"]),
        (["cmd"], ["Super_L"]),
        (["Control_R"], ["Control_R"]),
        ([], []),
        (None, []),
    ],
)
def test_pointer_action_modifiers(oa: dict[str, Any], keys: list[str] | None, modifiers: list[str]) -> None:
    action = one({**oa, **({} if keys is None else {"keys": keys})})
    assert isinstance(action, a.Click | a.Move | a.Scroll | a.Drag)
    assert action.modifiers == modifiers


@pytest.mark.parametrize(
    ("raw", "code", "field"),
    [
        ("click", ErrorCode.INVALID_FIELD, "openai"),
        ({}, ErrorCode.MISSING_FIELD, "openai.type"),
        ({"type": "fly"}, ErrorCode.UNKNOWN_ACTION, "openai.type"),
        ({"type": "left_click"}, ErrorCode.UNKNOWN_ACTION, "openai.type"),
        ({"type": "click", "x": 1}, ErrorCode.MISSING_FIELD, "openai.y"),
        ({"type": "click", "y": 1}, ErrorCode.MISSING_FIELD, "openai.x"),
        ({"type": "click", "x": 1, "y": 1, "button": "middle"}, ErrorCode.INVALID_FIELD, "openai.button"),
        ({"type": "click", "x": "a", "y": 1}, ErrorCode.INVALID_FIELD, "openai.x"),
        ({"type": "click", "x": 1, "y": 1, "bogus": True}, ErrorCode.UNKNOWN_FIELD, "openai.bogus"),
        ({"type": "click", "x": 1, "y": 1, "keys": ["A"]}, ErrorCode.UNKNOWN_KEY, "openai.keys[0]"),
        ({"type": "click", "x": 1, "y": 1, "keys": ["SHIFT", "ENTER"]}, ErrorCode.UNKNOWN_KEY, "openai.keys[1]"),
        ({"type": "click", "x": 1, "y": 1, "keys": ["SHIFT", "BOGUS"]}, ErrorCode.UNKNOWN_KEY, "openai.keys[1]"),
        ({"type": "click", "x": 1, "y": 1, "keys": [""]}, ErrorCode.INVALID_FIELD, "openai.keys[0]"),
        ({"type": "click", "x": 1, "y": 1, "keys": "SHIFT"}, ErrorCode.INVALID_FIELD, "openai.keys"),
        ({"type": "click", "x": 1, "y": 1, "keys": ["SHIFT"] * 17}, ErrorCode.INVALID_FIELD, "openai.keys"),
        ({"type": "click", "x": 100_001, "y": 1}, ErrorCode.INVALID_FIELD, "openai.x"),
        ({"type": "double_click", "x": 1}, ErrorCode.MISSING_FIELD, "openai.y"),
        ({"type": "double_click", "x": 1, "y": 1, "button": "left"}, ErrorCode.UNKNOWN_FIELD, "openai.button"),
        ({"type": "move", "x": 1, "y": 1, "keys": ["TAB"]}, ErrorCode.UNKNOWN_KEY, "openai.keys[0]"),
        ({"type": "drag"}, ErrorCode.MISSING_FIELD, "openai.path"),
        ({"type": "drag", "path": [{"x": 1, "y": 1}]}, ErrorCode.INVALID_FIELD, "openai.path"),
        ({"type": "drag", "path": [{"x": 1, "y": 1}, {"x": 1}]}, ErrorCode.MISSING_FIELD, "openai.path[1].y"),
        ({"type": "drag", "path": [{"x": 1, "y": 1}, [2, 2]]}, ErrorCode.INVALID_FIELD, "openai.path[1]"),
        (
            {"type": "drag", "path": [{"x": 0, "y": 0}, {"x": 1, "y": 1}], "keys": ["a"]},
            ErrorCode.UNKNOWN_KEY,
            "openai.keys[0]",
        ),
        ({"type": "keypress"}, ErrorCode.MISSING_FIELD, "openai.keys"),
        ({"type": "keypress", "keys": []}, ErrorCode.INVALID_FIELD, "openai.keys"),
        ({"type": "keypress", "keys": ["CTRL", "BOGUS"]}, ErrorCode.UNKNOWN_KEY, "openai.keys[1]"),
        ({"type": "keypress", "keys": ["x" * 65]}, ErrorCode.INVALID_FIELD, "openai.keys[0]"),
        ({"type": "scroll", "x": 1, "y": 1, "scroll_y": 1.5}, ErrorCode.INVALID_FIELD, "openai.scroll_y"),
        ({"type": "scroll", "x": 1, "y": 1, "scroll_y": 100_001}, ErrorCode.INVALID_FIELD, "openai.dy"),
        ({"type": "scroll", "scroll_y": 5}, ErrorCode.MISSING_FIELD, "openai.x"),
        ({"type": "type"}, ErrorCode.MISSING_FIELD, "openai.text"),
        ({"type": "type", "text": "nul\x00"}, ErrorCode.INVALID_FIELD, "openai.text"),
        ({"type": "type", "text": "a" * 20_001}, ErrorCode.TEXT_TOO_LONG, "openai.text"),
        ({"type": "wait", "ms": -1}, ErrorCode.INVALID_FIELD, "openai.ms"),
        ({"type": "wait", "ms": 60_001}, ErrorCode.INVALID_FIELD, "openai.ms"),
        ({"type": "screenshot", "format": "png"}, ErrorCode.UNKNOWN_FIELD, "openai.format"),
    ],
)
def test_bad_input(raw: Any, code: ErrorCode, field: str) -> None:
    err = rejected(raw)
    assert (err.code, err.field) == (code, field)
    assert err.message


def test_not_a_modifier_message() -> None:
    err = rejected({"type": "click", "x": 1, "y": 1, "keys": ["ENTER"]})
    assert err.message == "'Return' is not a modifier key"


# Batches.


def test_single_action_is_one_step_under_the_field() -> None:
    assert openai.translate({"type": "wait"}, FIELD) == [(native({"type": "wait", "ms": 1000}), "openai")]


def test_batch_steps_are_indexed() -> None:
    steps = openai.translate(
        [{"type": "click", "x": 1, "y": 2}, {"type": "type", "text": "hi"}, {"type": "keypress", "keys": ["ENTER"]}],
        FIELD,
    )
    assert steps == [
        (native({"type": "click", "x": 1, "y": 2}), "openai[0]"),
        (native({"type": "type", "text": "hi"}), "openai[1]"),
        (native({"type": "key", "keys": "Return"}), "openai[2]"),
    ]


def test_batch_of_the_maximum_size() -> None:
    assert len(openai.translate([{"type": "wait", "ms": 0}] * openai.MAX_BATCH, FIELD)) == openai.MAX_BATCH


@pytest.mark.parametrize(
    ("batch", "code", "field"),
    [
        ([], ErrorCode.INVALID_REQUEST, "openai"),
        ([{"type": "wait"}] * 101, ErrorCode.INVALID_REQUEST, "openai"),
        ([{"type": "wait"}, {"type": "click", "x": 1}], ErrorCode.MISSING_FIELD, "openai[1].y"),
        ([{"type": "wait"}, {"type": "fly"}], ErrorCode.UNKNOWN_ACTION, "openai[1].type"),
        (["wait"], ErrorCode.INVALID_FIELD, "openai[0]"),
        (
            [{"type": "wait"}, {"type": "wait"}, {"type": "keypress", "keys": ["CTRL", "NOPE"]}],
            ErrorCode.UNKNOWN_KEY,
            "openai[2].keys[1]",
        ),
        ([{"type": "click", "x": 1, "y": 1, "keys": ["ENTER"]}], ErrorCode.UNKNOWN_KEY, "openai[0].keys[0]"),
        (
            [{"type": "move", "x": 1, "y": 1}, {"type": "drag", "path": [{"x": 1, "y": 1}, {"y": 2}]}],
            ErrorCode.MISSING_FIELD,
            "openai[1].path[1].x",
        ),
        ([{"type": "wait"}, {"type": "type", "text": "x", "delay": 1}], ErrorCode.UNKNOWN_FIELD, "openai[1].delay"),
    ],
)
def test_batch_errors(batch: list[Any], code: ErrorCode, field: str) -> None:
    err = rejected(batch)
    assert (err.code, err.field) == (code, field)


def test_batch_size_messages() -> None:
    assert "empty" in rejected([]).message
    assert "100" in rejected([{"type": "wait"}] * 101).message


@pytest.mark.parametrize(
    ("batch", "field", "where"),
    [
        ([{"type": "wait"}, {"type": "click", "x": 1, "y": 800}], "openai[1].x", "(1, 800)"),
        ([{"type": "move", "x": 1280, "y": 0}], "openai[0].x", "(1280, 0)"),
        (
            [{"type": "wait"}, {"type": "wait"}, {"type": "scroll", "x": -1, "y": 0, "scroll_y": 5}],
            "openai[2].x",
            "(-1, 0)",
        ),
        (
            [{"type": "drag", "path": [{"x": 0, "y": 0}, {"x": 5, "y": 5}, {"x": 5, "y": 801}]}],
            "openai[0].path[2]",
            "(5, 801)",
        ),
    ],
)
def test_batch_out_of_bounds(fail: FailFn, batch: list[Any], field: str, where: str) -> None:
    err = fail({"openai": batch})
    assert (err.code, err.field) == (ErrorCode.OUT_OF_BOUNDS, field)
    assert where in err.message


def test_single_out_of_bounds(fail: FailFn) -> None:
    err = fail({"openai": {"type": "double_click", "x": 2000, "y": 5}})
    assert (err.code, err.field) == (ErrorCode.OUT_OF_BOUNDS, "openai.x")


def test_batch_plan(plan: PlanFn) -> None:
    p = plan({"openai": [{"type": "click", "x": 1279, "y": 799}, {"type": "wait", "ms": 10}]})
    assert [(s.action.type, s.field) for s in p.steps] == [("click", "openai[0]"), ("wait", "openai[1]")]


# call_output.


@pytest.mark.parametrize(
    ("media_type", "data"),
    [("image/png", b"\x89PNG\r\n\x1a\nrest"), ("image/jpeg", b"\xff\xd8\xff\xe0"), ("image/webp", b"RIFF....WEBP")],
)
def test_call_output(media_type: str, data: bytes) -> None:
    out = openai.call_output(EncodedImage(media_type, data, 10, 10))
    assert out["type"] == "computer_screenshot"
    prefix = f"data:{media_type};base64,"
    assert out["image_url"].startswith(prefix)
    assert base64.b64decode(out["image_url"][len(prefix) :]) == data
    assert set(out) == {"type", "image_url"}
