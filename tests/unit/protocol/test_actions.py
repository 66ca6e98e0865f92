"""The native action models: defaults, shape validation, error codes/paths, points and mapping."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import TypeAdapter, ValidationError

from corral.errors import ActionError, ErrorCode
from corral.protocol import ACTION_TYPES, NativeAction, Region, ScreenshotOptions
from corral.protocol import actions as a
from corral.protocol.actions import ACTIONS
from corral.protocol.validation import validate

ADAPTER: TypeAdapter[NativeAction] = TypeAdapter(NativeAction)


def native(data: dict[str, Any]) -> NativeAction:
    return validate(ADAPTER, data, "action", tagged=True)


def rejected(data: Any) -> ActionError:
    with pytest.raises(ActionError) as info:
        validate(ADAPTER, data, "action", tagged=True)
    return info.value


class Doubler:
    """A PointMapper that doubles points and vectors."""

    def point(self, x: int, y: int) -> tuple[int, int]:
        return 2 * x, 2 * y

    def vector(self, dx: int, dy: int) -> tuple[int, int]:
        return 2 * dx, 2 * dy


# One minimal valid payload per action type.
MINIMAL: dict[str, dict[str, Any]] = {
    "screenshot": {},
    "zoom": {"region": {"x": 0, "y": 0, "width": 10, "height": 10}},
    "click": {},
    "mouse_down": {},
    "mouse_up": {},
    "move": {"x": 1, "y": 2},
    "drag": {"path": [{"x": 0, "y": 0}, {"x": 5, "y": 5}]},
    "scroll": {"direction": "down"},
    "type": {"text": "hi"},
    "key": {"keys": "Return"},
    "wait": {},
    "cursor_position": {},
    "clipboard_get": {},
    "clipboard_set": {"text": ""},
    "navigate": {"url": "https://example.com/"},
    "back": {},
    "forward": {},
    "reload": {},
    "page_info": {},
    "tabs": {},
    "tab_new": {},
    "tab_switch": {"tab": 0},
    "tab_close": {},
    "file_read": {"path": "notes.txt"},
    "file_write": {"path": "notes.txt", "content": ""},
    "file_list": {"path": "."},
    "file_stat": {"path": "/workspace"},
    "file_remove": {"path": "notes.txt"},
    "file_move": {"source": "a", "destination": "b"},
    "exec": {"argv": ["true"]},
    "process_list": {},
    "process_wait": {"pid": 7},
    "process_kill": {"pid": 7},
    "process_write": {"pid": 7, "data": "y\n"},
    "process_output": {"pid": 7},
    "process_resize": {"pid": 7, "rows": 24, "cols": 80},
    "secrets": {},
    "control": {"wait_ms": 1000},
    "request_control": {"reason": "solve the CAPTCHA"},
    "shell": {"command": "pwd"},
    "edit": {"command": "view", "path": "/workspace"},
    "apply_patch": {"operation": "delete_file", "path": "notes.txt"},
    "file_glob": {"pattern": "**/*.py"},
    "file_grep": {"pattern": "TODO"},
    "run_code": {"code": "1 + 1"},
    "list_code_contexts": {},
    "restart_code_context": {},
    "remove_code_context": {"context": "data"},
}


def test_every_action_type_has_a_minimal_example() -> None:
    # MINIMAL is written by hand; ACTION_TYPES is derived from the union the validator uses.
    assert set(MINIMAL) == set(ACTION_TYPES)
    assert len(ACTION_TYPES) == len(set(ACTION_TYPES))


def test_the_registry_is_the_union() -> None:
    members = get_args(get_args(NativeAction)[0])  # Annotated[AnyAction, discriminator] -> the union's members
    assert tuple(ACTIONS.values()) == members == get_args(a.AnyAction)
    assert tuple(ACTIONS) == ACTION_TYPES
    for kind, model in ACTIONS.items():
        assert type(native({"type": kind, **MINIMAL[kind]})) is model  # the validator picks the registered model


@pytest.mark.parametrize("kind", ACTION_TYPES)
def test_minimal_action_validates_to_its_type(kind: str) -> None:
    action = native({"type": kind, **MINIMAL[kind]})
    assert action.type == kind


@pytest.mark.parametrize("kind", [k for k in ACTION_TYPES if k not in ("cursor_position", "clipboard_get")])
def test_unknown_fields_are_rejected_on_every_action(kind: str) -> None:
    err = rejected({"type": kind, **MINIMAL[kind], "bogus": 1})
    assert err.code is ErrorCode.UNKNOWN_FIELD
    assert err.field == "action.bogus"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"type": "click"}, {"button": "left", "count": 1, "modifiers": [], "x": None, "y": None}),
        ({"type": "mouse_down"}, {"button": "left", "x": None, "y": None}),
        ({"type": "mouse_up", "button": "right"}, {"button": "right"}),
        ({"type": "move", "x": 3, "y": 4}, {"modifiers": []}),
        ({"type": "drag", "path": [{"x": 0, "y": 0}, {"x": 1, "y": 1}]}, {"button": "left", "step_px": 24}),
        ({"type": "key", "keys": "a"}, {"repeat": 1, "hold_ms": None}),
        ({"type": "type", "text": "x"}, {"delay_ms": 0}),
        ({"type": "wait"}, {"ms": 1000}),
        (
            {"type": "screenshot"},
            {"format": "png", "quality": None, "scale": None, "width": None, "region": None, "cursor": False},
        ),
        (
            {"type": "zoom", "region": {"x": 0, "y": 0, "width": 1, "height": 1}},
            {"format": "png", "quality": None, "width": None, "cursor": False},
        ),
        ({"type": "navigate", "url": "about:blank"}, {"wait_until": "load", "timeout_ms": 30_000}),
        ({"type": "back"}, {"timeout_ms": 30_000}),
        ({"type": "reload"}, {"timeout_ms": 30_000}),
        ({"type": "tab_new"}, {"url": None}),
        ({"type": "tab_close"}, {"tab": None}),
    ],
)
def test_defaults(data: dict[str, Any], expected: dict[str, Any]) -> None:
    dumped = native(data).model_dump()
    assert {k: dumped[k] for k in expected} == expected


@pytest.mark.parametrize("tab", [0, 3, "page-1", "T"])
def test_tab_refs_are_index_or_id(tab: int | str) -> None:
    action = native({"type": "tab_switch", "tab": tab})
    assert isinstance(action, a.TabSwitch)
    assert action.tab == tab


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/",
        "http://localhost:8000",
        "about:blank",
        "about:blank#top",
        "HTTPS://EXAMPLE.COM/",
        "data:text/html,hi",
        "blob:https://example.com/0f4c3a9e",
    ],
)
def test_navigate_accepts_web_pages(url: str) -> None:
    action = native({"type": "navigate", "url": url})
    assert isinstance(action, a.Navigate)
    assert action.url == url


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "FILE:///home/agent/x.html",
        "chrome://settings",
        "chrome://crash",
        " \tchrome://quit",
        "chr\nome://hang",
        "chrome-untrusted://terminal/",
        "chrome-extension://abc/page.html",
        "devtools://devtools/bundled/inspector.html",
        "view-source:https://a.b/",
        "view-source:file:///etc/passwd",
        "about:version",
        "about:blankx",
        "javascript:alert(1)",
        "mailto:someone@example.com",
        "git+ssh://host/repo",
    ],
)
@pytest.mark.parametrize("action", ["navigate", "tab_new"])
def test_pages_that_are_not_the_webs_are_refused(url: str, action: str) -> None:
    err = rejected({"type": action, "url": url})
    assert err.code is ErrorCode.URL_REFUSED
    assert err.field == "action.url"
    assert "chrome://" in err.message


@pytest.mark.parametrize("url", ["example.com", "/relative/path", ":nothing", "ht tp://x", "日本:x", "a_b://x"])
def test_navigate_rejects_urls_without_a_scheme(url: str) -> None:
    err = rejected({"type": "navigate", "url": url})
    assert err.code is ErrorCode.INVALID_FIELD
    assert err.field == "action.url"
    assert "scheme" in err.message


@pytest.mark.parametrize(
    ("data", "code", "field"),
    [
        ({}, ErrorCode.MISSING_FIELD, "action.type"),
        ({"x": 1}, ErrorCode.MISSING_FIELD, "action.type"),
        ({"type": "fly"}, ErrorCode.UNKNOWN_ACTION, "action.type"),
        ({"type": "left_click"}, ErrorCode.UNKNOWN_ACTION, "action.type"),
        ("click", ErrorCode.INVALID_FIELD, "action"),
        ([], ErrorCode.INVALID_FIELD, "action"),
        ({"type": "click", "x": 5}, ErrorCode.MISSING_FIELD, "action.y"),
        ({"type": "click", "y": 5}, ErrorCode.MISSING_FIELD, "action.x"),
        ({"type": "mouse_down", "x": 5}, ErrorCode.MISSING_FIELD, "action.y"),
        ({"type": "scroll", "direction": "up", "y": 5}, ErrorCode.MISSING_FIELD, "action.x"),
        ({"type": "click", "x": "left", "y": 1}, ErrorCode.INVALID_FIELD, "action.x"),
        ({"type": "click", "x": 100_001, "y": 1}, ErrorCode.INVALID_FIELD, "action.x"),
        ({"type": "click", "x": 1, "y": -100_001}, ErrorCode.INVALID_FIELD, "action.y"),
        ({"type": "click", "button": "wheel"}, ErrorCode.INVALID_FIELD, "action.button"),
        ({"type": "click", "count": 4}, ErrorCode.INVALID_FIELD, "action.count"),
        ({"type": "click", "count": 0}, ErrorCode.INVALID_FIELD, "action.count"),
        ({"type": "click", "modifiers": ["a"]}, ErrorCode.UNKNOWN_KEY, "action.modifiers"),
        ({"type": "click", "modifiers": ["ctrl", "bogus"]}, ErrorCode.UNKNOWN_KEY, "action.modifiers"),
        ({"type": "click", "modifiers": ["ctrl"] * 9}, ErrorCode.INVALID_FIELD, "action.modifiers"),
        ({"type": "click", "modifiers": "ctrl"}, ErrorCode.INVALID_FIELD, "action.modifiers"),
        ({"type": "move", "x": 1}, ErrorCode.MISSING_FIELD, "action.y"),
        ({"type": "move", "y": 1}, ErrorCode.MISSING_FIELD, "action.x"),
        ({"type": "move", "x": 1, "y": 1, "modifiers": ["Return"]}, ErrorCode.UNKNOWN_KEY, "action.modifiers"),
        ({"type": "drag"}, ErrorCode.MISSING_FIELD, "action.path"),
        ({"type": "drag", "path": [{"x": 1, "y": 1}]}, ErrorCode.INVALID_FIELD, "action.path"),
        ({"type": "drag", "path": [{"x": 1, "y": 1}, {"x": 1}]}, ErrorCode.MISSING_FIELD, "action.path[1].y"),
        (
            {"type": "drag", "path": [{"x": 1, "y": 1}, {"x": 1, "y": 2, "z": 3}]},
            ErrorCode.UNKNOWN_FIELD,
            "action.path[1].z",
        ),
        ({"type": "drag", "path": [{"x": 1, "y": 1}] * 1001}, ErrorCode.INVALID_FIELD, "action.path"),
        (
            {"type": "drag", "path": [{"x": 0, "y": 0}, {"x": 1, "y": 1}], "step_px": 0},
            ErrorCode.INVALID_FIELD,
            "action.step_px",
        ),
        ({"type": "scroll"}, ErrorCode.MISSING_FIELD, "action"),
        ({"type": "scroll", "clicks": 3}, ErrorCode.MISSING_FIELD, "action"),
        ({"type": "scroll", "direction": "up", "dy": 3}, ErrorCode.INVALID_FIELD, "action"),
        ({"type": "scroll", "clicks": 2, "dx": 3}, ErrorCode.INVALID_FIELD, "action"),
        ({"type": "scroll", "direction": "sideways"}, ErrorCode.INVALID_FIELD, "action.direction"),
        ({"type": "scroll", "direction": "up", "clicks": 0}, ErrorCode.INVALID_FIELD, "action.clicks"),
        ({"type": "scroll", "direction": "up", "clicks": 201}, ErrorCode.INVALID_FIELD, "action.clicks"),
        ({"type": "scroll", "dy": 100_001}, ErrorCode.INVALID_FIELD, "action.dy"),
        ({"type": "type"}, ErrorCode.MISSING_FIELD, "action.text"),
        ({"type": "type", "text": "a" * 20_001}, ErrorCode.TEXT_TOO_LONG, "action.text"),
        ({"type": "type", "text": "ok\x00"}, ErrorCode.INVALID_FIELD, "action.text"),
        ({"type": "type", "text": "\ud800"}, ErrorCode.INVALID_FIELD, "action.text"),
        ({"type": "type", "text": "x", "delay_ms": 1001}, ErrorCode.INVALID_FIELD, "action.delay_ms"),
        ({"type": "key"}, ErrorCode.MISSING_FIELD, "action.keys"),
        ({"type": "key", "keys": ""}, ErrorCode.INVALID_FIELD, "action.keys"),
        ({"type": "key", "keys": "ctrl+bogus"}, ErrorCode.UNKNOWN_KEY, "action.keys"),
        ({"type": "key", "keys": "Return Retrun"}, ErrorCode.UNKNOWN_KEY, "action.keys"),
        ({"type": "key", "keys": "a", "hold_ms": 10_001}, ErrorCode.INVALID_FIELD, "action.hold_ms"),
        ({"type": "key", "keys": "a", "repeat": 0}, ErrorCode.INVALID_FIELD, "action.repeat"),
        ({"type": "key", "keys": "a", "repeat": 101}, ErrorCode.INVALID_FIELD, "action.repeat"),
        ({"type": "wait", "ms": -1}, ErrorCode.INVALID_FIELD, "action.ms"),
        ({"type": "wait", "ms": 60_001}, ErrorCode.INVALID_FIELD, "action.ms"),
        ({"type": "screenshot", "format": "gif"}, ErrorCode.INVALID_FIELD, "action.format"),
        ({"type": "screenshot", "quality": 0}, ErrorCode.INVALID_FIELD, "action.quality"),
        ({"type": "screenshot", "quality": 101}, ErrorCode.INVALID_FIELD, "action.quality"),
        ({"type": "screenshot", "scale": 0}, ErrorCode.INVALID_FIELD, "action.scale"),
        ({"type": "screenshot", "scale": 4.5}, ErrorCode.INVALID_FIELD, "action.scale"),
        ({"type": "screenshot", "width": 7}, ErrorCode.INVALID_FIELD, "action.width"),
        ({"type": "screenshot", "scale": 0.5, "width": 640}, ErrorCode.INVALID_FIELD, "action"),
        (
            {"type": "screenshot", "region": {"x": 0, "y": 0, "width": 0, "height": 5}},
            ErrorCode.INVALID_FIELD,
            "action.region.width",
        ),
        (
            {"type": "screenshot", "region": {"x": 0, "y": 0, "width": 5}},
            ErrorCode.MISSING_FIELD,
            "action.region.height",
        ),
        ({"type": "zoom"}, ErrorCode.MISSING_FIELD, "action.region"),
        (
            {"type": "zoom", "region": {"x": 0, "y": 0, "width": 5, "height": 5}, "scale": 2},
            ErrorCode.UNKNOWN_FIELD,
            "action.scale",
        ),
        ({"type": "clipboard_set"}, ErrorCode.MISSING_FIELD, "action.text"),
        ({"type": "clipboard_set", "text": "a" * 1_000_001}, ErrorCode.INVALID_FIELD, "action.text"),
        ({"type": "navigate"}, ErrorCode.MISSING_FIELD, "action.url"),
        ({"type": "navigate", "url": ""}, ErrorCode.INVALID_FIELD, "action.url"),
        (
            {"type": "navigate", "url": "https://a.b", "wait_until": "idle"},
            ErrorCode.INVALID_FIELD,
            "action.wait_until",
        ),
        ({"type": "navigate", "url": "https://a.b", "timeout_ms": 0}, ErrorCode.INVALID_FIELD, "action.timeout_ms"),
        ({"type": "tab_switch"}, ErrorCode.MISSING_FIELD, "action.tab"),
        ({"type": "tab_switch", "tab": -1}, ErrorCode.INVALID_FIELD, "action.tab"),
        ({"type": "tab_switch", "tab": ""}, ErrorCode.INVALID_FIELD, "action.tab"),
        ({"type": "tab_switch", "tab": [1]}, ErrorCode.INVALID_FIELD, "action.tab"),
        ({"type": "tab_close", "tab": "x" * 65}, ErrorCode.INVALID_FIELD, "action.tab"),
    ],
)
def test_validation_errors(data: Any, code: ErrorCode, field: str) -> None:
    err = rejected(data)
    assert (err.code, err.field) == (code, field)
    assert err.message


def test_unknown_action_message_lists_the_types() -> None:
    err = rejected({"type": "fly"})
    assert "'fly'" in err.message
    for kind in ("screenshot", "click", "tab_close"):
        assert kind in err.message


def test_missing_coordinate_message_names_it() -> None:
    err = rejected({"type": "click", "x": 5})
    assert "y is missing" in err.message


def test_not_a_modifier_message_names_the_key() -> None:
    err = rejected({"type": "click", "modifiers": ["a"]})
    assert err.message.startswith("'a' is not a modifier key")
    assert "{" not in err.message


def test_text_too_long_message_gives_the_numbers() -> None:
    err = rejected({"type": "type", "text": "a" * 20_001})
    assert "20001" in err.message
    assert "20000" in err.message


def test_untypeable_character_message_gives_its_index() -> None:
    err = rejected({"type": "type", "text": "ab\x07"})
    assert err.message.startswith("character 2:")
    assert "U+0007" in err.message


@pytest.mark.parametrize("text", ["", "hello", "a\tb\nc\r", "日本語 😀 é", "a" * 20_000, "\x1b[A"])
def test_typeable_text(text: str) -> None:
    action = native({"type": "type", "text": text})
    assert isinstance(action, a.Type)
    assert action.text == text


@pytest.mark.parametrize("modifiers", [["ctrl"], ["shift", "alt"], ["Control_R", "super", "cmd", "meta", "altgr"]])
def test_modifiers_are_kept_as_given(modifiers: list[str]) -> None:
    action = native({"type": "click", "x": 1, "y": 1, "modifiers": modifiers})
    assert isinstance(action, a.Click)
    assert action.modifiers == modifiers


def test_key_combos() -> None:
    action = native({"type": "key", "keys": "ctrl+a BackSpace", "repeat": 2, "hold_ms": 50})
    assert isinstance(action, a.Key)
    assert [str(c) for c in action.combos()] == ["Control_L+a", "BackSpace"]
    assert (action.repeat, action.hold_ms) == (2, 50)


def test_actions_are_frozen() -> None:
    action = native({"type": "click", "x": 1, "y": 2})
    with pytest.raises(ValidationError):
        action.x = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    ("data", "points"),
    [
        ({"type": "click"}, []),
        ({"type": "click", "x": 3, "y": 4}, [("x", 3, 4)]),
        ({"type": "mouse_down", "x": 0, "y": 9}, [("x", 0, 9)]),
        ({"type": "mouse_up"}, []),
        ({"type": "move", "x": 7, "y": 8}, [("x", 7, 8)]),
        ({"type": "scroll", "x": 1, "y": 2, "dy": 10}, [("x", 1, 2)]),
        (
            {"type": "drag", "path": [{"x": 1, "y": 2}, {"x": 3, "y": 4}, {"x": 5, "y": 6}]},
            [("path[0]", 1, 2), ("path[1]", 3, 4), ("path[2]", 5, 6)],
        ),
        ({"type": "screenshot", "region": {"x": 1, "y": 1, "width": 2, "height": 2}}, []),
        ({"type": "wait"}, []),
        ({"type": "type", "text": "x"}, []),
    ],
)
def test_points(data: dict[str, Any], points: list[tuple[str, int, int]]) -> None:
    assert list(native(data).points()) == points


@pytest.mark.parametrize(
    ("data", "regions"),
    [
        ({"type": "screenshot"}, []),
        (
            {"type": "screenshot", "region": {"x": 1, "y": 2, "width": 3, "height": 4}},
            [("region", Region(x=1, y=2, width=3, height=4))],
        ),
        (
            {"type": "zoom", "region": {"x": 5, "y": 6, "width": 7, "height": 8}},
            [("region", Region(x=5, y=6, width=7, height=8))],
        ),
        ({"type": "click", "x": 1, "y": 1}, []),
    ],
)
def test_regions(data: dict[str, Any], regions: list[tuple[str, Region]]) -> None:
    assert list(native(data).regions()) == regions


@pytest.mark.parametrize(
    ("data", "mapped"),
    [
        ({"type": "click", "x": 3, "y": 4}, {"x": 6, "y": 8}),
        ({"type": "click"}, {"x": None, "y": None}),
        ({"type": "mouse_down", "x": 1, "y": 2}, {"x": 2, "y": 4}),
        ({"type": "mouse_up", "x": 5, "y": 0}, {"x": 10, "y": 0}),
        ({"type": "move", "x": 10, "y": 20}, {"x": 20, "y": 40}),
        (
            {"type": "drag", "path": [{"x": 1, "y": 2}, {"x": 3, "y": 4}]},
            {"path": [{"x": 2, "y": 4}, {"x": 6, "y": 8}]},
        ),
        (
            {"type": "scroll", "x": 1, "y": 1, "direction": "down", "clicks": 3},
            {"x": 2, "y": 2, "direction": "down", "clicks": 3, "dx": None, "dy": None},
        ),
        ({"type": "scroll", "x": 1, "y": 1, "dx": 5, "dy": -7}, {"x": 2, "y": 2, "dx": 10, "dy": -14}),
        ({"type": "scroll", "dy": 30}, {"x": None, "y": None, "dx": None, "dy": 60}),
        ({"type": "scroll", "dx": -4}, {"dx": -8, "dy": None}),
        (
            {"type": "screenshot", "region": {"x": 1, "y": 2, "width": 3, "height": 4}},
            {"region": {"x": 2, "y": 4, "width": 6, "height": 8}},
        ),
        ({"type": "screenshot"}, {"region": None}),
        (
            {"type": "zoom", "region": {"x": 1, "y": 2, "width": 3, "height": 4}},
            {"region": {"x": 2, "y": 4, "width": 6, "height": 8}},
        ),
        ({"type": "type", "text": "abc"}, {"text": "abc"}),
    ],
)
def test_map_points(data: dict[str, Any], mapped: dict[str, Any]) -> None:
    before = native(data)
    after = before.map_points(Doubler())
    assert type(after) is type(before)
    dumped = after.model_dump()
    assert {k: dumped[k] for k in mapped} == mapped
    # The original is left alone.
    assert before == native(data)


def test_region_mapped_keeps_at_least_one_pixel() -> None:
    class Shrink:
        def point(self, x: int, y: int) -> tuple[int, int]:
            return x // 10, y // 10

        def vector(self, dx: int, dy: int) -> tuple[int, int]:
            return dx // 10, dy // 10

    region = Region(x=50, y=60, width=3, height=4).mapped(Shrink())
    assert region == Region(x=5, y=6, width=1, height=1)


def test_screenshot_options_drop_the_type() -> None:
    action = native(
        {
            "type": "screenshot",
            "format": "jpeg",
            "quality": 50,
            "width": 640,
            "cursor": True,
            "region": {"x": 0, "y": 0, "width": 100, "height": 100},
        }
    )
    assert isinstance(action, a.Screenshot)
    options = action.options()
    assert type(options) is ScreenshotOptions
    assert options == ScreenshotOptions(
        format="jpeg", quality=50, width=640, cursor=True, region=Region(x=0, y=0, width=100, height=100)
    )


def test_screenshot_options_reject_scale_and_width() -> None:
    with pytest.raises(ValidationError, match="either scale or width"):
        ScreenshotOptions(scale=0.5, width=100)


def test_zoom_takes_a_screenshot_of_its_region() -> None:
    zoom = native(
        {"type": "zoom", "region": {"x": 1, "y": 2, "width": 30, "height": 40}, "format": "jpeg", "quality": 50}
        | {"width": 100, "cursor": True}
    )
    assert isinstance(zoom, a.Zoom)
    region = Region(x=1, y=2, width=30, height=40)
    assert zoom.options() == ScreenshotOptions(format="jpeg", quality=50, region=region, width=100, cursor=True)


def test_every_action_is_in_the_protocols_table() -> None:
    docs = Path(__file__).resolve().parents[3] / "docs" / "protocol.md"
    table = docs.read_text().split("## Native actions", 1)[1].split("\n### ", 1)[0]
    first_cells = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    documented = {name for cell in first_cells for name in re.findall(r"`([a-z_]+)`", cell)}
    assert documented == set(ACTION_TYPES)


# -- file actions -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"type": "file_read", "path": "a\x00b"}, "action.path"),
        ({"type": "file_read", "path": "bad\udcff"}, "action.path"),  # a lone surrogate, as JSON can carry it
        ({"type": "file_write", "path": "\x00", "content": ""}, "action.path"),
        ({"type": "file_read", "path_base64": "YQBi"}, "action.path_base64"),  # "a\x00b"
        ({"type": "file_read", "path_base64": "not base64!"}, "action.path_base64"),
        ({"type": "file_move", "source": "a", "destination": "b\x00"}, "action.destination"),
        ({"type": "file_read", "path": ""}, "action.path"),
        ({"type": "file_write", "path": "a", "content": "\ud800"}, "action.content"),
        ({"type": "file_write", "path": "a", "content_base64": "%%%"}, "action.content_base64"),
        ({"type": "file_write", "path": "a", "content": "", "mode": "0999"}, "action.mode"),
        ({"type": "file_write", "path": "a", "content": "", "mode": 0o17777}, "action.mode"),
        ({"type": "file_read", "path": "a", "length": (8 << 20) + 1}, "action.length"),
        ({"type": "file_read", "path": "a", "offset": -1}, "action.offset"),
        ({"type": "file_list", "path": "a", "limit": 10_001}, "action.limit"),
        ({"type": "file_read", "path": "a", "encoding": "latin-1"}, "action.encoding"),
    ],
)
def test_file_actions_refuse_what_no_path_or_content_can_be(data: dict[str, Any], field: str) -> None:
    err = rejected(data)
    assert (err.code, err.field) == (ErrorCode.INVALID_FIELD, field)
    assert "\x00" not in err.message and "\udcff" not in err.message  # a reply can always carry it


@pytest.mark.parametrize(
    ("data", "code", "field"),
    [
        ({"type": "file_read"}, ErrorCode.MISSING_FIELD, "action.path"),
        ({"type": "file_read", "path": "a", "path_base64": "YQ=="}, ErrorCode.INVALID_FIELD, "action"),
        ({"type": "file_write", "path": "a"}, ErrorCode.MISSING_FIELD, "action.content"),
        ({"type": "file_write", "path": "a", "content": "", "content_base64": ""}, ErrorCode.INVALID_FIELD, "action"),
        ({"type": "file_move", "destination": "b"}, ErrorCode.MISSING_FIELD, "action.source"),
        ({"type": "file_move", "source": "a"}, ErrorCode.MISSING_FIELD, "action.destination"),
    ],
)
def test_file_actions_take_each_path_one_way(data: dict[str, Any], code: ErrorCode, field: str) -> None:
    err = rejected(data)
    assert (err.code, err.field) == (code, field)


def test_file_action_values() -> None:
    write = native({"type": "file_write", "path": "a", "content_base64": "AP8=", "mode": "0o755"})
    assert isinstance(write, a.FileWrite)
    assert (write.data(), write.file_mode(), write.append, write.make_dirs) == (b"\x00\xff", 0o755, False, False)
    text = native({"type": "file_write", "path": "a", "content": "é", "mode": 420})
    assert isinstance(text, a.FileWrite) and text.data() == "é".encode() and text.file_mode() == 0o644
    short = native({"type": "file_write", "path": "a", "content": "", "mode": "644"})
    assert isinstance(short, a.FileWrite) and short.file_mode() == 0o644
    read = native({"type": "file_read", "path_base64": "Y2Fm6Q=="})  # caf\xe9: not UTF-8
    assert isinstance(read, a.FileRead) and read.target() == "caf\udce9"  # os.fsdecode's spelling
    assert (read.offset, read.length, read.encoding) == (0, 8 << 20, "utf-8")
    move = native({"type": "file_move", "source": "a", "destination_base64": "Yg=="})
    assert isinstance(move, a.FileMove) and move.paths() == ("a", "b") and move.overwrite is False
    listing = native({"type": "file_list", "path": "."})
    assert isinstance(listing, a.FileList)
    assert (listing.recursive, listing.pattern, listing.limit) == (False, None, 1000)


def test_the_action_flags_follow_what_each_action_does() -> None:
    """The flags on the models are what the dispatcher, the viewers and replay read; each family's
    union says which actions never touch the screen, so a new action of it that forgot its flag fails."""
    every: tuple[type[a._Action], ...] = get_args(a.AnyAction)
    beside = {
        *a.FILE_ACTIONS,
        *a.PROCESS_ACTIONS,
        *a.TOOL_ACTIONS,
        *a.CODE_ACTIONS,
        a.Secrets,
        a.Control,
        a.RequestControl,
    }
    assert {model for model in every if model.runs_apart} == beside
    assert {model for model in every if model.lease} == {a.Control, a.RequestControl}
    assert a.LEASE_TYPES == ("control", "request_control")
    assert set(a.HUMAN_INPUT) == {a.Move, a.MouseDown, a.MouseUp, a.Click, a.Scroll, a.Key, a.Type}
    assert not any(model.runs_apart for model in a.HUMAN_INPUT)
