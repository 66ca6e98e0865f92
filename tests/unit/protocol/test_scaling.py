"""A declared display (1024x640) smaller than the screen (1280x800): everything maps by 1.25."""

from __future__ import annotations

from typing import Any

import pytest

from corral.errors import ErrorCode
from corral.protocol import Region, Scale, ScreenshotOptions, Size
from corral.protocol import actions as a

from .conftest import FailFn, PlanFn

DISPLAY = {"width": 1024, "height": 640}
SCALE = Scale(screen=Size(1280, 800), display=Size(1024, 640))


def scaled(payload: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {**payload, "display": DISPLAY, **extra}


def test_plan_carries_the_scale(plan: PlanFn) -> None:
    p = plan(scaled({"action": {"type": "wait"}}))
    assert p.scale == SCALE
    assert not p.scale.is_identity


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({"action": {"type": "click", "x": 512, "y": 320}}, {"type": "click", "x": 640, "y": 400}),
        ({"action": {"type": "click", "x": 0, "y": 0}}, {"type": "click", "x": 0, "y": 0}),
        ({"action": {"type": "click", "x": 1023, "y": 639}}, {"type": "click", "x": 1279, "y": 799}),
        ({"action": {"type": "click"}}, {"type": "click"}),
        ({"action": {"type": "mouse_down", "x": 100, "y": 40}}, {"type": "mouse_down", "x": 125, "y": 50}),
        (
            {"action": {"type": "mouse_up", "x": 4, "y": 4, "button": "right"}},
            {"type": "mouse_up", "x": 5, "y": 5, "button": "right"},
        ),
        ({"action": {"type": "move", "x": 800, "y": 600}}, {"type": "move", "x": 1000, "y": 750}),
        ({"anthropic": {"action": "left_click", "coordinate": [512, 320]}}, {"type": "click", "x": 640, "y": 400}),
        ({"anthropic": {"action": "mouse_move", "coordinate": [1023, 639]}}, {"type": "move", "x": 1279, "y": 799}),
        (
            {"anthropic": {"action": "double_click", "coordinate": [8, 16], "text": "shift"}},
            {"type": "click", "count": 2, "x": 10, "y": 20, "modifiers": ["shift"]},
        ),
        (
            {"openai": {"type": "click", "x": 400, "y": 200, "button": "wheel"}},
            {"type": "click", "button": "middle", "x": 500, "y": 250},
        ),
        ({"openai": {"type": "move", "x": 1, "y": 1}}, {"type": "move", "x": 1, "y": 1}),
    ],
)
def test_points(plan: PlanFn, payload: dict[str, Any], expected: dict[str, Any]) -> None:
    [step] = plan(scaled(payload)).steps
    assert step.action.model_dump(exclude_defaults=True) == expected


@pytest.mark.parametrize(
    ("payload", "path"),
    [
        (
            {"action": {"type": "drag", "path": [{"x": 0, "y": 0}, {"x": 512, "y": 320}, {"x": 1023, "y": 639}]}},
            [(0, 0), (640, 400), (1279, 799)],
        ),
        (
            {"anthropic": {"action": "left_click_drag", "start_coordinate": [100, 100], "coordinate": [200, 40]}},
            [(125, 125), (250, 50)],
        ),
        (
            {"openai": {"type": "drag", "path": [{"x": 8, "y": 8}, {"x": 16, "y": 24}, {"x": 800, "y": 480}]}},
            [(10, 10), (20, 30), (1000, 600)],
        ),
    ],
)
def test_drag_paths(plan: PlanFn, payload: dict[str, Any], path: list[tuple[int, int]]) -> None:
    [step] = plan(scaled(payload)).steps
    assert isinstance(step.action, a.Drag)
    assert [(p.x, p.y) for p in step.action.path] == path


@pytest.mark.parametrize(
    ("payload", "region"),
    [
        (
            {"action": {"type": "zoom", "region": {"x": 100, "y": 80, "width": 200, "height": 40}}},
            Region(x=125, y=100, width=250, height=50),
        ),
        (
            {"action": {"type": "zoom", "region": {"x": 0, "y": 0, "width": 1024, "height": 640}}},
            Region(x=0, y=0, width=1280, height=800),
        ),
        (
            {"anthropic": {"action": "zoom", "region": [512, 320, 1024, 640]}},
            Region(x=640, y=400, width=640, height=400),
        ),
        ({"anthropic": {"action": "zoom", "region": [8, 8, 16, 24]}}, Region(x=10, y=10, width=10, height=20)),
    ],
)
def test_zoom_regions(plan: PlanFn, payload: dict[str, Any], region: Region) -> None:
    [step] = plan(scaled(payload)).steps
    assert isinstance(step.action, a.Zoom)
    assert step.action.region == region
    assert step.action.width is None  # a zoom is at the screen's full resolution


@pytest.mark.parametrize(
    ("payload", "xy", "dxdy"),
    [
        ({"action": {"type": "scroll", "x": 100, "y": 100, "dx": 100, "dy": -40}}, (125, 125), (125, -50)),
        ({"action": {"type": "scroll", "dy": 80}}, (None, None), (None, 100)),
        ({"action": {"type": "scroll", "dx": -8}}, (None, None), (-10, None)),
        ({"openai": {"type": "scroll", "x": 512, "y": 320, "scroll_x": 0, "scroll_y": 400}}, (640, 400), (0, 500)),
        ({"openai": {"type": "scroll", "x": 0, "y": 0, "scroll_x": -120, "scroll_y": 8}}, (0, 0), (-150, 10)),
    ],
)
def test_scroll_pixel_vectors(
    plan: PlanFn, payload: dict[str, Any], xy: tuple[Any, Any], dxdy: tuple[Any, Any]
) -> None:
    [step] = plan(scaled(payload)).steps
    assert isinstance(step.action, a.Scroll)
    assert (step.action.x, step.action.y) == xy
    assert (step.action.dx, step.action.dy) == dxdy


def test_scroll_clicks_are_not_scaled(plan: PlanFn) -> None:
    [step] = plan(
        scaled(
            {
                "anthropic": {
                    "action": "scroll",
                    "coordinate": [512, 320],
                    "scroll_direction": "down",
                    "scroll_amount": 4,
                }
            }
        )
    ).steps
    assert isinstance(step.action, a.Scroll)
    assert (step.action.x, step.action.y, step.action.direction, step.action.clicks) == (640, 400, "down", 4)
    assert (step.action.dx, step.action.dy) == (None, None)


# Screenshots come back in display pixels unless the caller sizes them.


@pytest.mark.parametrize(
    ("payload", "width"),
    [
        ({"action": {"type": "screenshot"}}, 1024),
        ({"anthropic": {"action": "screenshot"}}, 1024),
        ({"openai": {"type": "screenshot"}}, 1024),
        ({"action": {"type": "screenshot", "width": 512}}, 512),
        ({"action": {"type": "screenshot", "format": "jpeg", "quality": 60}}, 1024),
    ],
)
def test_screenshot_width_defaults_to_the_display_width(plan: PlanFn, payload: dict[str, Any], width: int) -> None:
    [step] = plan(scaled(payload)).steps
    assert isinstance(step.action, a.Screenshot)
    assert step.action.width == width
    assert step.action.region is None


def test_screenshot_scale_is_left_alone(plan: PlanFn) -> None:
    [step] = plan(scaled({"action": {"type": "screenshot", "scale": 0.5}})).steps
    assert isinstance(step.action, a.Screenshot)
    assert (step.action.scale, step.action.width) == (0.5, None)


def test_screenshot_region_is_mapped_and_sized_to_the_regions_display_width(plan: PlanFn) -> None:
    region = {"x": 8, "y": 16, "width": 100, "height": 50}
    [step] = plan(scaled({"action": {"type": "screenshot", "region": region}})).steps
    assert isinstance(step.action, a.Screenshot)
    assert step.action.region == Region(x=10, y=20, width=125, height=62)
    assert step.action.width == 100


@pytest.mark.parametrize(
    ("payload", "after"),
    [
        ({"anthropic": {"action": "left_click", "coordinate": [1, 1]}}, ScreenshotOptions(width=1024)),
        ({"openai": {"type": "click", "x": 1, "y": 1}}, ScreenshotOptions(width=1024)),
        ({"action": {"type": "wait"}, "screenshot": True}, ScreenshotOptions(width=1024)),
        ({"action": {"type": "wait"}, "screenshot": {"format": "webp"}}, ScreenshotOptions(format="webp", width=1024)),
        ({"action": {"type": "wait"}, "screenshot": {"width": 300}}, ScreenshotOptions(width=300)),
        ({"action": {"type": "wait"}, "screenshot": {"scale": 0.25}}, ScreenshotOptions(scale=0.25)),
        (
            {"action": {"type": "wait"}, "screenshot": {"region": {"x": 512, "y": 320, "width": 512, "height": 320}}},
            ScreenshotOptions(region=Region(x=640, y=400, width=640, height=400), width=512),
        ),
        (
            {
                "action": {"type": "wait"},
                "screenshot": {"region": {"x": 0, "y": 0, "width": 100, "height": 100}, "width": 50},
            },
            ScreenshotOptions(region=Region(x=0, y=0, width=125, height=125), width=50),
        ),
    ],
)
def test_after_screenshot(plan: PlanFn, payload: dict[str, Any], after: ScreenshotOptions) -> None:
    assert plan(scaled(payload)).after.screenshot == after


def test_no_scaling_leaves_screenshot_width_unset(plan: PlanFn) -> None:
    p = plan({"anthropic": {"action": "left_click", "coordinate": [1, 1]}})
    assert p.after.screenshot == ScreenshotOptions()
    [step] = plan({"action": {"type": "screenshot"}}).steps
    assert isinstance(step.action, a.Screenshot) and step.action.width is None


# Bounds are the display's, and errors speak in display coordinates.


@pytest.mark.parametrize(
    ("payload", "field", "where"),
    [
        ({"action": {"type": "click", "x": 1024, "y": 0}}, "action.x", "(1024, 0) is off the screen"),
        ({"action": {"type": "click", "x": 0, "y": 640}}, "action.x", "(0, 640)"),
        ({"action": {"type": "move", "x": 1100, "y": 700}}, "action.x", "x must be in 0..1023 and y in 0..639"),
        (
            {"action": {"type": "drag", "path": [{"x": 0, "y": 0}, {"x": 1200, "y": 10}]}},
            "action.path[1]",
            "(1200, 10)",
        ),
        (
            {"action": {"type": "zoom", "region": {"x": 1000, "y": 0, "width": 25, "height": 10}}},
            "action.region",
            "region 1000,0 25x10 does not fit the 1024x640 screen",
        ),
        (
            {"action": {"type": "screenshot", "region": {"x": 0, "y": 600, "width": 10, "height": 41}}},
            "action.region",
            "1024x640",
        ),
        (
            {"action": {"type": "wait"}, "screenshot": {"region": {"x": 0, "y": 0, "width": 1025, "height": 10}}},
            "screenshot.region",
            "0,0 1025x10 does not fit the 1024x640 screen",
        ),
        ({"anthropic": {"action": "left_click", "coordinate": [1279, 799]}}, "anthropic.coordinate", "(1279, 799)"),
        ({"anthropic": {"action": "zoom", "region": [0, 0, 1025, 10]}}, "anthropic.region", "1024x640"),
        ({"openai": [{"type": "wait"}, {"type": "click", "x": 1024, "y": 5}]}, "openai[1].x", "(1024, 5)"),
    ],
)
def test_out_of_bounds_in_display_coordinates(fail: FailFn, payload: dict[str, Any], field: str, where: str) -> None:
    err = fail(scaled(payload))
    assert (err.code, err.field) == (ErrorCode.OUT_OF_BOUNDS, field)
    assert where in err.message


def test_display_larger_than_the_screen(plan: PlanFn) -> None:
    p = plan({"action": {"type": "click", "x": 2559, "y": 1599}, "display": {"width": 2560, "height": 1600}})
    [step] = p.steps
    assert isinstance(step.action, a.Click)
    assert (step.action.x, step.action.y) == (1279, 799)
    assert p.scale == Scale(screen=Size(1280, 800), display=Size(2560, 1600))


@pytest.mark.parametrize("x", [0, 1, 2, 3, 511, 512, 777, 1022, 1023])
@pytest.mark.parametrize("y", [0, 1, 2, 319, 638, 639])
def test_every_display_point_lands_on_the_screen(plan: PlanFn, x: int, y: int) -> None:
    [step] = plan(scaled({"action": {"type": "click", "x": x, "y": y}})).steps
    assert isinstance(step.action, a.Click)
    assert step.action.x is not None and step.action.y is not None
    assert 0 <= step.action.x < 1280 and 0 <= step.action.y < 800
    assert SCALE.to_display(step.action.x, step.action.y) == (x, y)
