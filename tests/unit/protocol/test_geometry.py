"""Sizes, the display<->screen scale and bounds checks."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import TypeAdapter

from corral.errors import ActionError, ErrorCode
from corral.protocol import NativeAction, Region, Scale, Size
from corral.protocol.geometry import check_bounds

ADAPTER: TypeAdapter[NativeAction] = TypeAdapter(NativeAction)
SCREEN = Size(1280, 800)
HALF = Scale(screen=Size(1280, 800), display=Size(640, 400))
SMALLER = Scale(screen=Size(1280, 800), display=Size(1024, 640))


def test_size_str_and_equality() -> None:
    assert str(Size(1280, 800)) == "1280x800"
    assert Size(1, 2) == Size(1, 2)
    assert Size(1, 2) != Size(2, 1)


@pytest.mark.parametrize(
    ("scale", "identity"),
    [
        (Scale(screen=Size(1280, 800), display=Size(1280, 800)), True),
        (SMALLER, False),
        (Scale(screen=Size(1280, 800), display=Size(1280, 801)), False),
    ],
)
def test_is_identity(scale: Scale, identity: bool) -> None:
    assert scale.is_identity is identity


@pytest.mark.parametrize(
    ("scale", "vector", "expected"),
    [
        (HALF, (10, 20), (20, 40)),
        (HALF, (-5, 7), (-10, 14)),
        (HALF, (0, 0), (0, 0)),
        (SMALLER, (100, 100), (125, 125)),
        (SMALLER, (1024, 640), (1280, 800)),
        (SMALLER, (-40, 8), (-50, 10)),
        (SMALLER, (1, 1), (1, 1)),  # 1.25 rounds down
        (SMALLER, (2, 2), (2, 2)),  # 2.5 rounds half to even
        (SMALLER, (3, 3), (4, 4)),  # 3.75 rounds up
        (SMALLER, (2000, 2000), (2500, 2500)),  # vectors are not clamped
    ],
)
def test_vector(scale: Scale, vector: tuple[int, int], expected: tuple[int, int]) -> None:
    assert scale.vector(*vector) == expected


@pytest.mark.parametrize(
    ("scale", "point", "expected"),
    [
        (HALF, (0, 0), (0, 0)),
        (HALF, (320, 200), (640, 400)),
        (HALF, (639, 399), (1278, 798)),
        (SMALLER, (512, 320), (640, 400)),
        (SMALLER, (1023, 639), (1279, 799)),  # 1278.75 / 798.75 round onto the last pixel
        (SMALLER, (1024, 640), (1279, 799)),  # off the display: clamped onto the screen's edge
        (Scale(screen=Size(100, 100), display=Size(30, 30)), (29, 29), (97, 97)),
        (Scale(screen=Size(100, 100), display=Size(16, 16)), (15, 15), (94, 94)),
        (Scale(screen=Size(100, 100), display=Size(199, 199)), (198, 198), (99, 99)),
    ],
)
def test_point(scale: Scale, point: tuple[int, int], expected: tuple[int, int]) -> None:
    assert scale.point(*point) == expected


@pytest.mark.parametrize(
    ("scale", "point", "expected"),
    [
        (SMALLER, (640, 400), (512, 320)),
        (SMALLER, (0, 0), (0, 0)),
        (SMALLER, (1279, 799), (1023, 639)),
        (SMALLER, (1280, 800), (1023, 639)),  # clamped onto the display
        (HALF, (101, 51), (50, 26)),
    ],
)
def test_to_display(scale: Scale, point: tuple[int, int], expected: tuple[int, int]) -> None:
    assert scale.to_display(*point) == expected


@pytest.mark.parametrize("x", range(0, 1024, 7))
def test_point_round_trips_through_the_display(x: int) -> None:
    y = x * 640 // 1024
    sx, sy = SMALLER.point(x, y)
    assert 0 <= sx < 1280 and 0 <= sy < 800
    assert SMALLER.to_display(sx, sy) == (x, y)


def action(data: dict[str, Any]) -> NativeAction:
    return ADAPTER.validate_python(data)


@pytest.mark.parametrize(
    "data",
    [
        {"type": "click", "x": 0, "y": 0},
        {"type": "click", "x": 1279, "y": 799},
        {"type": "click"},
        {"type": "move", "x": 640, "y": 400},
        {"type": "drag", "path": [{"x": 0, "y": 799}, {"x": 1279, "y": 0}]},
        {"type": "scroll", "x": 5, "y": 5, "dy": 100_000},
        {"type": "zoom", "region": {"x": 0, "y": 0, "width": 1280, "height": 800}},
        {"type": "zoom", "region": {"x": 1279, "y": 799, "width": 1, "height": 1}},
        {"type": "screenshot", "region": {"x": 280, "y": 0, "width": 1000, "height": 800}},
        {"type": "screenshot"},
        {"type": "wait"},
        {"type": "key", "keys": "Return"},
    ],
)
def test_check_bounds_accepts_on_screen(data: dict[str, Any]) -> None:
    check_bounds(action(data), SCREEN, "action")


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"type": "click", "x": 1280, "y": 0}, "action.x", "(1280, 0) is off the screen"),
        ({"type": "click", "x": 0, "y": 800}, "action.x", "(0, 800) is off the screen"),
        ({"type": "click", "x": -1, "y": 5}, "action.x", "(-1, 5)"),
        ({"type": "mouse_down", "x": 5, "y": -1}, "action.x", "(5, -1)"),
        ({"type": "move", "x": 99_999, "y": 1}, "action.x", "x must be in 0..1279 and y in 0..799"),
        (
            {"type": "drag", "path": [{"x": 0, "y": 0}, {"x": 1, "y": 1}, {"x": 1, "y": 900}]},
            "action.path[2]",
            "(1, 900)",
        ),
        ({"type": "drag", "path": [{"x": -3, "y": 0}, {"x": 1, "y": 900}]}, "action.path[0]", "(-3, 0)"),
        (
            {"type": "zoom", "region": {"x": 1200, "y": 0, "width": 81, "height": 10}},
            "action.region",
            "region 1200,0 81x10 does not fit the 1280x800 screen",
        ),
        ({"type": "zoom", "region": {"x": 0, "y": 700, "width": 10, "height": 101}}, "action.region", "0,700 10x101"),
        ({"type": "screenshot", "region": {"x": -1, "y": 0, "width": 10, "height": 10}}, "action.region", "-1,0"),
        ({"type": "screenshot", "region": {"x": 0, "y": -1, "width": 10, "height": 10}}, "action.region", "0,-1"),
    ],
)
def test_check_bounds_rejects_off_screen(data: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(ActionError) as info:
        check_bounds(action(data), SCREEN, "action")
    assert info.value.code is ErrorCode.OUT_OF_BOUNDS
    assert info.value.field == field
    assert message in info.value.message


def test_check_bounds_uses_the_prefix() -> None:
    with pytest.raises(ActionError) as info:
        check_bounds(action({"type": "click", "x": 5000, "y": 1}), SCREEN, "openai[3]")
    assert info.value.field == "openai[3].x"


def test_check_bounds_ignores_objects_without_points() -> None:
    check_bounds(object(), Size(1, 1), "action")
    check_bounds(Region(x=0, y=0, width=5, height=5), Size(1, 1), "action")


@pytest.mark.parametrize(
    ("region", "mapped"),
    [
        (Region(x=0, y=0, width=1024, height=640), Region(x=0, y=0, width=1280, height=800)),
        (Region(x=100, y=80, width=200, height=40), Region(x=125, y=100, width=250, height=50)),
        (Region(x=1023, y=639, width=1, height=1), Region(x=1279, y=799, width=1, height=1)),
    ],
)
def test_region_mapped_by_scale(region: Region, mapped: Region) -> None:
    assert region.mapped(SMALLER) == mapped


@pytest.mark.parametrize("x", [0, 1, 2, 3, 5, 6, 10, 13, 500, 777, 1000, 1023])
@pytest.mark.parametrize("y", [0, 1, 2, 3, 7, 320, 639])
def test_regions_that_fit_the_display_fit_the_screen(x: int, y: int) -> None:
    region = Region(x=x, y=y, width=1024 - x, height=640 - y)
    check_bounds(action({"type": "zoom", "region": region.model_dump()}), Size(1024, 640), "r")
    check_bounds(action({"type": "zoom", "region": region.mapped(SMALLER).model_dump()}), SCREEN, "r")
