"""Screen sizes, bounds checks and the scaling between a dialect's declared display and the real screen."""

from __future__ import annotations

from dataclasses import dataclass

from corral.errors import ActionError, ErrorCode
from corral.protocol.actions import Region


@dataclass(frozen=True, slots=True)
class Size:
    width: int
    height: int

    def __str__(self) -> str:
        return f"{self.width}x{self.height}"


@dataclass(frozen=True, slots=True)
class Scale:
    """Maps coordinates between a declared display (what the model sees) and the real screen."""

    screen: Size
    display: Size

    @property
    def is_identity(self) -> bool:
        return self.screen == self.display

    def vector(self, dx: int, dy: int) -> tuple[int, int]:
        """A distance or size, display to screen (not clamped)."""
        return round(dx * self.screen.width / self.display.width), round(dy * self.screen.height / self.display.height)

    def point(self, x: int, y: int) -> tuple[int, int]:
        """A point, display to screen, kept on the screen (rounding may land on the edge)."""
        sx, sy = self.vector(x, y)
        return min(sx, self.screen.width - 1), min(sy, self.screen.height - 1)

    def to_display(self, x: int, y: int) -> tuple[int, int]:
        dx = round(x * self.display.width / self.screen.width)
        dy = round(y * self.display.height / self.screen.height)
        return min(dx, self.display.width - 1), min(dy, self.display.height - 1)


def _check_point(field: str, x: int, y: int, bounds: Size) -> None:
    if not (0 <= x < bounds.width and 0 <= y < bounds.height):
        raise ActionError(
            ErrorCode.OUT_OF_BOUNDS,
            f"({x}, {y}) is off the screen; x must be in 0..{bounds.width - 1} and y in 0..{bounds.height - 1}",
            field=field,
        )


def _check_region(field: str, region: Region, bounds: Size) -> None:
    if (
        region.x < 0
        or region.y < 0
        or region.x + region.width > bounds.width
        or (region.y + region.height > bounds.height)
    ):
        raise ActionError(
            ErrorCode.OUT_OF_BOUNDS,
            f"region {region.x},{region.y} {region.width}x{region.height} does not fit the {bounds} screen",
            field=field,
        )


def check_bounds(action: object, bounds: Size, prefix: str) -> None:
    """Raise ``out_of_bounds`` naming the first point or region of ``action`` that is off ``bounds``."""
    points = getattr(action, "points", None)
    regions = getattr(action, "regions", None)
    if points is not None:
        for name, x, y in points():
            _check_point(f"{prefix}.{name}", x, y, bounds)
    if regions is not None:
        for name, region in regions():
            _check_region(f"{prefix}.{name}", region, bounds)
