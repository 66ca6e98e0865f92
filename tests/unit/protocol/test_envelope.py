"""Envelopes: decoding JSON text, request ids, and plan_request's validation, defaults and error paths."""

from __future__ import annotations

import json
from typing import Any

import pytest

from corral.errors import ActionError, ErrorCode
from corral.protocol import Dialect, Limits, Region, ScreenshotOptions, Size, decode, request_id_of
from corral.protocol import actions as a

from .conftest import FailFn, PlanFn

WAIT = {"type": "wait", "ms": 0}


# decode ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        '{"action": {"type": "wait"}}',
        b'{"action": {"type": "wait"}}',
        '  {"action":{"type":"wait"}}\n',
        '{"action": {"type": "wait"}}'.encode("utf-16"),
    ],
)
def test_decode_objects(raw: str | bytes) -> None:
    assert decode(raw, Limits()) == {"action": {"type": "wait"}}


def test_decode_keeps_unicode() -> None:
    obj = decode(json.dumps({"anthropic": {"action": "type", "text": "héllo 😀"}}), Limits())
    assert obj["anthropic"]["text"] == "héllo 😀"


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("", ErrorCode.INVALID_JSON),
        ("{", ErrorCode.INVALID_JSON),
        ("{'single': 'quotes'}", ErrorCode.INVALID_JSON),
        ('{"a": 1} trailing', ErrorCode.INVALID_JSON),
        (b"\xff\xfe\x00garbage\xff", ErrorCode.INVALID_JSON),
        (b'{"text": "\xff"}', ErrorCode.INVALID_JSON),
        # Python reads these, JSON has them not: nothing downstream (the recording) could write them back.
        ('{"action": {"type": "move", "x": NaN, "y": 1}}', ErrorCode.INVALID_JSON),
        ('{"id": Infinity, "action": {"type": "screenshot"}}', ErrorCode.INVALID_JSON),
        ('{"id": -Infinity, "action": {"type": "screenshot"}}', ErrorCode.INVALID_JSON),
        ('{"id": 1e999, "action": {"type": "screenshot"}}', ErrorCode.INVALID_JSON),
        ("[]", ErrorCode.INVALID_REQUEST),
        ('[{"type": "click"}]', ErrorCode.INVALID_REQUEST),
        ("42", ErrorCode.INVALID_REQUEST),
        ('"action"', ErrorCode.INVALID_REQUEST),
        ("null", ErrorCode.INVALID_REQUEST),
        ("true", ErrorCode.INVALID_REQUEST),
    ],
)
def test_decode_rejects(raw: str | bytes, code: ErrorCode) -> None:
    with pytest.raises(ActionError) as info:
        decode(raw, Limits())
    assert info.value.code is code
    assert info.value.field is None


def test_decode_size_limit_counts_utf8_bytes() -> None:
    limits = Limits(max_message_bytes=20)
    ok = '{"t": "' + "a" * 11 + '"}'  # 20 bytes
    assert len(ok.encode()) == 20
    assert decode(ok, limits) == {"t": "a" * 11}
    too_big = '{"t": "' + "é" * 6 + '"}'  # 15 characters, 21 bytes
    assert (len(too_big), len(too_big.encode())) == (15, 21)
    with pytest.raises(ActionError) as info:
        decode(too_big, limits)
    assert info.value.code is ErrorCode.MESSAGE_TOO_LARGE
    assert "21 bytes" in info.value.message
    assert "20" in info.value.message


def test_decode_size_limit_applies_before_parsing() -> None:
    with pytest.raises(ActionError) as info:
        decode(b"x" * 101, Limits(max_message_bytes=100))
    assert info.value.code is ErrorCode.MESSAGE_TOO_LARGE


# request_id_of ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({"id": "abc"}, "abc"),
        ({"id": ""}, ""),
        ({"id": 7}, 7),
        ({"id": 0}, 0),
        ({"id": -3}, -3),
        ({"id": "x" * 256}, "x" * 256),
        ({"id": "x" * 257}, None),
        ({"id": True}, None),
        ({"id": False}, None),
        ({"id": None}, None),
        ({"id": 1.5}, None),
        ({"id": [1]}, None),
        ({"id": {"a": 1}}, None),
        ({}, None),
    ],
)
def test_request_id_of(obj: dict[str, Any], expected: Any) -> None:
    assert request_id_of(obj) == expected


# plan_request: the happy paths -----------------------------------------------------------------------------------


def test_native_plan(plan: PlanFn, limits: Limits) -> None:
    p = plan({"id": "r1", "action": {"type": "click", "x": 10, "y": 20}})
    assert p.request_id == "r1"
    assert p.dialect is Dialect.NATIVE
    assert len(p.steps) == 1
    assert p.steps[0].field == "action"
    assert p.steps[0].action == a.Click(type="click", x=10, y=20)
    assert p.timeout_ms == limits.timeout_ms
    assert p.scale is None
    assert p.after.screenshot is None
    assert p.after.wait_for_stable is False
    assert p.after.settle_timeout_ms == limits.settle_timeout_ms
    assert p.after.settle_quiet_ms == limits.settle_quiet_ms


@pytest.mark.parametrize("request_id", ["abc", 0, 99, None])
def test_request_id_is_carried(plan: PlanFn, request_id: Any) -> None:
    obj: dict[str, Any] = {"action": WAIT}
    if request_id is not None:
        obj["id"] = request_id
    assert plan(obj).request_id == request_id


@pytest.mark.parametrize(
    ("screenshot", "expected"),
    [
        (True, ScreenshotOptions()),
        (False, None),
        ({}, ScreenshotOptions()),
        ({"format": "jpeg", "quality": 40}, ScreenshotOptions(format="jpeg", quality=40)),
        ({"format": "webp", "scale": 0.5, "cursor": True}, ScreenshotOptions(format="webp", scale=0.5, cursor=True)),
        ({"width": 640}, ScreenshotOptions(width=640)),
        (
            {"region": {"x": 0, "y": 0, "width": 1280, "height": 800}},
            ScreenshotOptions(region=Region(x=0, y=0, width=1280, height=800)),
        ),
    ],
)
def test_after_screenshot_options(plan: PlanFn, screenshot: Any, expected: ScreenshotOptions | None) -> None:
    assert plan({"action": WAIT, "screenshot": screenshot}).after.screenshot == expected


def test_after_screenshot_is_dropped_when_the_last_step_is_an_image(plan: PlanFn) -> None:
    shot = plan({"action": {"type": "screenshot"}, "screenshot": True})
    zoom = plan({"action": {"type": "zoom", "region": {"x": 0, "y": 0, "width": 8, "height": 8}}, "screenshot": True})
    assert shot.after.screenshot is None
    assert zoom.after.screenshot is None


@pytest.mark.parametrize(
    ("extra", "stable", "settle_timeout", "settle_quiet"),
    [
        ({}, False, 3_000, 120),
        ({"wait_for": "stable"}, True, 3_000, 120),
        ({"wait_for": "none"}, False, 3_000, 120),
        ({"wait_for": "stable", "settle_timeout_ms": 500, "settle_quiet_ms": 50}, True, 500, 50),
        ({"settle_timeout_ms": 0}, False, 0, 120),
        ({"settle_timeout_ms": 30_000, "settle_quiet_ms": 5_000}, False, 30_000, 5_000),
    ],
)
def test_after_settle(
    plan: PlanFn, extra: dict[str, Any], stable: bool, settle_timeout: int, settle_quiet: int
) -> None:
    after = plan({"action": WAIT, **extra}).after
    assert (after.wait_for_stable, after.settle_timeout_ms, after.settle_quiet_ms) == (
        stable,
        settle_timeout,
        settle_quiet,
    )


def test_settle_defaults_come_from_the_limits(plan: PlanFn) -> None:
    after = plan({"action": WAIT}, lim=Limits(settle_timeout_ms=1_234, settle_quiet_ms=56)).after
    assert (after.settle_timeout_ms, after.settle_quiet_ms) == (1_234, 56)


@pytest.mark.parametrize(("timeout", "expected"), [(None, 60_000), (1, 1), (5_000, 5_000), (600_000, 600_000)])
def test_timeout(plan: PlanFn, timeout: int | None, expected: int) -> None:
    obj: dict[str, Any] = {"action": WAIT}
    if timeout is not None:
        obj["timeout_ms"] = timeout
    assert plan(obj).timeout_ms == expected


def test_timeout_cap_comes_from_the_limits(fail: FailFn) -> None:
    err = fail({"action": WAIT, "timeout_ms": 1_001}, lim=Limits(max_timeout_ms=1_000))
    assert (err.code, err.field) == (ErrorCode.INVALID_FIELD, "timeout_ms")
    assert "1000" in err.message


def test_a_display_equal_to_the_screen_means_no_scaling(plan: PlanFn) -> None:
    p = plan({"action": {"type": "click", "x": 1279, "y": 799}, "display": {"width": 1280, "height": 800}})
    assert p.scale is None
    assert p.steps[0].action == a.Click(type="click", x=1279, y=799)


@pytest.mark.parametrize(
    ("payload", "dialect", "screenshot", "stable"),
    [
        ({"action": {"type": "click", "x": 1, "y": 1}}, Dialect.NATIVE, False, False),
        ({"action": {"type": "screenshot"}}, Dialect.NATIVE, False, False),
        ({"anthropic": {"action": "left_click", "coordinate": [1, 1]}}, Dialect.ANTHROPIC, True, True),
        ({"anthropic": {"action": "type", "text": "hi"}}, Dialect.ANTHROPIC, True, True),
        ({"anthropic": {"action": "wait", "duration": 0.1}}, Dialect.ANTHROPIC, True, True),
        ({"anthropic": {"action": "screenshot"}}, Dialect.ANTHROPIC, False, False),
        ({"anthropic": {"action": "zoom", "region": [0, 0, 10, 10]}}, Dialect.ANTHROPIC, False, False),
        ({"anthropic": {"action": "cursor_position"}}, Dialect.ANTHROPIC, False, False),
        ({"openai": {"type": "click", "x": 1, "y": 1}}, Dialect.OPENAI, True, True),
        ({"openai": {"type": "screenshot"}}, Dialect.OPENAI, False, False),
        ({"openai": [{"type": "click", "x": 1, "y": 1}, {"type": "type", "text": "a"}]}, Dialect.OPENAI, True, True),
        ({"openai": [{"type": "click", "x": 1, "y": 1}, {"type": "screenshot"}]}, Dialect.OPENAI, False, False),
    ],
)
def test_dialect_defaults(
    plan: PlanFn, payload: dict[str, Any], dialect: Dialect, screenshot: bool, stable: bool
) -> None:
    p = plan(payload)
    assert p.dialect is dialect
    assert (p.after.screenshot is not None) is screenshot
    assert p.after.wait_for_stable is stable


@pytest.mark.parametrize(
    ("payload", "screenshot", "stable"),
    [
        ({"anthropic": {"action": "left_click", "coordinate": [1, 1]}, "screenshot": False}, False, True),
        ({"anthropic": {"action": "left_click", "coordinate": [1, 1]}, "wait_for": "none"}, True, False),
        ({"anthropic": {"action": "cursor_position"}, "screenshot": True}, True, False),
        ({"openai": {"type": "click", "x": 1, "y": 1}, "screenshot": False, "wait_for": "none"}, False, False),
        ({"action": {"type": "click", "x": 1, "y": 1}, "screenshot": True, "wait_for": "stable"}, True, True),
    ],
)
def test_dialect_defaults_can_be_overridden(
    plan: PlanFn, payload: dict[str, Any], screenshot: bool, stable: bool
) -> None:
    p = plan(payload)
    assert (p.after.screenshot is not None) is screenshot
    assert p.after.wait_for_stable is stable


def test_openai_batch_steps_carry_their_index(plan: PlanFn) -> None:
    p = plan({"openai": [{"type": "move", "x": 1, "y": 1}, {"type": "wait", "ms": 5}, {"type": "type", "text": "a"}]})
    assert [s.field for s in p.steps] == ["openai[0]", "openai[1]", "openai[2]"]
    assert [s.action.type for s in p.steps] == ["move", "wait", "type"]


# plan_request: bad input -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "code", "field"),
    [
        # The envelope itself.
        ({}, ErrorCode.INVALID_REQUEST, None),
        ({"id": 1}, ErrorCode.INVALID_REQUEST, None),
        ({"action": WAIT, "openai": {"type": "wait"}}, ErrorCode.INVALID_REQUEST, None),
        ({"action": WAIT, "anthropic": {"action": "wait"}, "openai": {}}, ErrorCode.INVALID_REQUEST, None),
        ({"action": None}, ErrorCode.INVALID_REQUEST, None),
        ({"action": WAIT, "bogus": 1}, ErrorCode.UNKNOWN_FIELD, "bogus"),
        ({"action": WAIT, "Action": WAIT}, ErrorCode.UNKNOWN_FIELD, "Action"),
        ({"action": WAIT, "id": [1]}, ErrorCode.INVALID_FIELD, "id"),
        ({"action": WAIT, "id": 1.5}, ErrorCode.INVALID_FIELD, "id"),
        ({"action": WAIT, "id": "x" * 257}, ErrorCode.INVALID_FIELD, "id"),
        ({"action": WAIT, "timeout_ms": 0}, ErrorCode.INVALID_FIELD, "timeout_ms"),
        ({"action": WAIT, "timeout_ms": "soon"}, ErrorCode.INVALID_FIELD, "timeout_ms"),
        ({"action": WAIT, "timeout_ms": 600_001}, ErrorCode.INVALID_FIELD, "timeout_ms"),
        ({"action": WAIT, "wait_for": "idle"}, ErrorCode.INVALID_FIELD, "wait_for"),
        ({"action": WAIT, "settle_timeout_ms": -1}, ErrorCode.INVALID_FIELD, "settle_timeout_ms"),
        ({"action": WAIT, "settle_timeout_ms": 30_001}, ErrorCode.INVALID_FIELD, "settle_timeout_ms"),
        ({"action": WAIT, "settle_quiet_ms": 9}, ErrorCode.INVALID_FIELD, "settle_quiet_ms"),
        ({"action": WAIT, "settle_quiet_ms": 5_001}, ErrorCode.INVALID_FIELD, "settle_quiet_ms"),
        ({"action": WAIT, "display": {"width": 1024}}, ErrorCode.MISSING_FIELD, "display.height"),
        ({"action": WAIT, "display": {"width": 15, "height": 100}}, ErrorCode.INVALID_FIELD, "display.width"),
        ({"action": WAIT, "display": {"width": 100, "height": 16_385}}, ErrorCode.INVALID_FIELD, "display.height"),
        ({"action": WAIT, "display": {"width": 100, "height": 100, "dpi": 2}}, ErrorCode.UNKNOWN_FIELD, "display.dpi"),
        ({"action": WAIT, "display": "1024x640"}, ErrorCode.INVALID_FIELD, "display"),
        # The after-action screenshot (a bool or options: the options' own field is blamed).
        ({"action": WAIT, "screenshot": {"format": "gif"}}, ErrorCode.INVALID_FIELD, "screenshot.format"),
        ({"action": WAIT, "screenshot": {"width": 2}}, ErrorCode.INVALID_FIELD, "screenshot.width"),
        ({"action": WAIT, "screenshot": {"quality": 0}}, ErrorCode.INVALID_FIELD, "screenshot.quality"),
        ({"action": WAIT, "screenshot": {"scale": 0.5, "width": 100}}, ErrorCode.INVALID_FIELD, "screenshot"),
        ({"action": WAIT, "screenshot": {"bogus": True}}, ErrorCode.UNKNOWN_FIELD, "screenshot.bogus"),
        ({"action": WAIT, "screenshot": {"Format": "png"}}, ErrorCode.UNKNOWN_FIELD, "screenshot.Format"),
        ({"action": WAIT, "screenshot": {"bool": True}}, ErrorCode.UNKNOWN_FIELD, "screenshot.bool"),
        ({"action": WAIT, "screenshot": {"region": {"x": 0}}}, ErrorCode.MISSING_FIELD, "screenshot.region.y"),
        ({"action": WAIT, "screenshot": [1]}, ErrorCode.INVALID_FIELD, "screenshot"),
        (
            {"action": WAIT, "screenshot": {"region": {"x": 1200, "y": 0, "width": 100, "height": 10}}},
            ErrorCode.OUT_OF_BOUNDS,
            "screenshot.region",
        ),
        # Native actions.
        ({"action": "click"}, ErrorCode.INVALID_FIELD, "action"),
        ({"action": {}}, ErrorCode.MISSING_FIELD, "action.type"),
        ({"action": {"type": "fly"}}, ErrorCode.UNKNOWN_ACTION, "action.type"),
        ({"action": {"type": "click", "x": 5}}, ErrorCode.MISSING_FIELD, "action.y"),
        ({"action": {"type": "click", "x": 1280, "y": 0}}, ErrorCode.OUT_OF_BOUNDS, "action.x"),
        (
            {"action": {"type": "drag", "path": [{"x": 1, "y": 1}, {"x": 1, "y": 800}]}},
            ErrorCode.OUT_OF_BOUNDS,
            "action.path[1]",
        ),
        (
            {"action": {"type": "zoom", "region": {"x": 0, "y": 0, "width": 1281, "height": 8}}},
            ErrorCode.OUT_OF_BOUNDS,
            "action.region",
        ),
        ({"action": {"type": "key", "keys": "ctrl+bogus"}}, ErrorCode.UNKNOWN_KEY, "action.keys"),
        ({"action": {"type": "type", "text": "a" * 20_001}}, ErrorCode.TEXT_TOO_LONG, "action.text"),
        ({"action": {"type": "click", "x": 1, "y": 1, "bogus": 1}}, ErrorCode.UNKNOWN_FIELD, "action.bogus"),
        # Dialect payloads.
        ({"anthropic": "left_click"}, ErrorCode.INVALID_FIELD, "anthropic"),
        ({"anthropic": {}}, ErrorCode.MISSING_FIELD, "anthropic.action"),
        (
            {"anthropic": {"action": "left_click", "coordinate": [1280, 0]}},
            ErrorCode.OUT_OF_BOUNDS,
            "anthropic.coordinate",
        ),
        ({"openai": {}}, ErrorCode.MISSING_FIELD, "openai.type"),
        ({"openai": []}, ErrorCode.INVALID_REQUEST, "openai"),
        ({"openai": [{"type": "wait"}, {"type": "click", "x": 1, "y": 800}]}, ErrorCode.OUT_OF_BOUNDS, "openai[1].x"),
    ],
)
def test_bad_requests(fail: FailFn, obj: dict[str, Any], code: ErrorCode, field: str | None) -> None:
    err = fail(obj)
    assert (err.code, err.field) == (code, field)
    assert err.message


def test_two_payloads_are_named(fail: FailFn) -> None:
    err = fail({"action": WAIT, "openai": {"type": "wait"}})
    assert "(got action, openai)" in err.message


def test_missing_field_message_names_the_path(fail: FailFn) -> None:
    err = fail({"action": WAIT, "display": {"width": 1024}})
    assert err.message == "missing required field 'display.height'"


def test_unknown_field_message_names_the_path(fail: FailFn) -> None:
    err = fail({"action": {"type": "click", "bogus": 1}})
    assert err.message == "unknown field 'action.bogus'"


def test_bounds_are_the_screens(fail: FailFn) -> None:
    small = Size(640, 400)
    err = fail({"action": {"type": "click", "x": 640, "y": 0}}, screen=small)
    assert err.code is ErrorCode.OUT_OF_BOUNDS
    assert "0..639" in err.message and "0..399" in err.message


def test_error_dict_shape(fail: FailFn) -> None:
    err = fail({"action": {"type": "click", "x": 5000, "y": 0}})
    assert err.to_dict() == {"code": "out_of_bounds", "message": err.message, "field": "action.x"}
    no_field = fail({})
    assert no_field.to_dict() == {"code": "invalid_request", "message": no_field.message}


def test_a_lone_surrogate_id_is_not_echoed() -> None:
    from corral.protocol.envelope import request_id_of

    assert request_id_of({"id": "\ud800"}) is None
    assert request_id_of({"id": "ok-é"}) == "ok-é"


def test_images_larger_than_four_screens_are_refused() -> None:
    from corral.errors import ActionError
    from corral.protocol import Limits, Size, plan_request

    screen = Size(1280, 800)
    zoom = {"action": {"type": "zoom", "region": {"x": 0, "y": 0, "width": 1, "height": 800}, "width": 16384}}
    with pytest.raises(ActionError) as exc:
        plan_request(zoom, screen, Limits())
    assert exc.value.code == "invalid_field" and exc.value.field == "action.width"
    after = {
        "action": {"type": "move", "x": 1, "y": 1},
        "screenshot": {"region": {"x": 0, "y": 0, "width": 2, "height": 800}, "width": 8000},
    }
    with pytest.raises(ActionError) as exc:
        plan_request(after, screen, Limits())
    assert exc.value.field == "screenshot.width"
    ok = {"action": {"type": "zoom", "region": {"x": 0, "y": 0, "width": 320, "height": 200}, "width": 2560}}
    assert plan_request(ok, screen, Limits()).steps


@pytest.mark.parametrize(
    "raw",
    [
        "[" * 100_000 + "]" * 100_000,  # deeper than the parser's recursion
        '{"a": ' * 3000 + "1" + "}" * 3000,
        '{"id": 1, "action": {"type": "screenshot"}, "x": ' + "[" * 33 + "]" * 33 + "}",
    ],
)
def test_deep_nesting_is_invalid_json_not_a_crash(raw: str) -> None:
    with pytest.raises(ActionError) as caught:
        decode(raw, Limits())
    assert caught.value.code == ErrorCode.INVALID_JSON and "nests deeper than 32" in caught.value.message


def test_nesting_up_to_the_limit_parses() -> None:
    raw = '{"id": 1, "x": ' + "[" * 31 + "]" * 31 + "}"
    assert decode(raw, Limits())["id"] == 1
