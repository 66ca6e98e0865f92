"""Hands' presses and releases: each waits until the server has handed it to its window (XInput.delivered),
so the input after it cannot overtake it, however late the window manager replays a grabbed click."""

from __future__ import annotations

from typing import Any

import pytest

from corral.protocol import actions as a
from corral.sandbox import hands
from corral.sandbox.hands import Hands
from corral.sandbox.settings import ControllerSettings


class LateInput:
    """XTest as a loaded host shows it: each press or release reaches its window only after ``late``
    more looks (openbox holding a grabbed click until it is scheduled)."""

    def __init__(self, late: int | None) -> None:
        self.late = late
        self.calls: list[tuple[Any, ...]] = []
        self._looks = 0

    def button(self, button: str, down: bool, *, bare: bool = False) -> None:
        self.calls.append(("button", button, down, bare))
        self._looks = 0

    def delivered(self, button: str, down: bool, *, bare: bool = False, within_s: float = 0.0) -> bool:
        self.calls.append(("delivered", button, down, bare))
        self._looks += 1
        return self.late is not None and self._looks > self.late

    def move(self, x: int, y: int) -> None:
        self.calls.append(("move", x, y))

    def position(self) -> tuple[int, int]:
        return (0, 0)


class Clock:
    """time.monotonic for hands: every look at the clock moves it ``step`` seconds on."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def monotonic(self) -> float:
        self.now += self.step
        return self.now


def hands_with(monkeypatch: pytest.MonkeyPatch, late: int | None, step: float = 0.0001) -> tuple[Hands, LateInput]:
    monkeypatch.setattr(hands, "time", Clock(step))
    fake = LateInput(late)
    return Hands(ControllerSettings(), fake, None), fake  # type: ignore[arg-type]  # no browser call here


async def test_a_click_sends_its_release_only_once_the_press_reached_the_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    done, fake = hands_with(monkeypatch, late=3)
    await done.run(a.Click(type="click", x=5, y=6))
    looks = [("delivered", "left", True, False)] * 4
    assert fake.calls == [
        ("move", 5, 6),
        ("button", "left", True, False),
        *looks,
        ("button", "left", False, False),
        *[("delivered", "left", False, False)] * 4,
    ]


async def test_a_bare_press_waits_for_the_grab_to_let_it_go(monkeypatch: pytest.MonkeyPatch) -> None:
    done, fake = hands_with(monkeypatch, late=2)
    await done.run(a.MouseDown(type="mouse_down", x=1, y=2))
    # A press with no release after it: XInput asks the window manager (the ``bare`` flag) and waits for it.
    assert fake.calls[1:] == [("button", "left", True, True), *[("delivered", "left", True, True)] * 3]
    await done.run(a.MouseUp(type="mouse_up"))
    assert fake.calls[-1] == ("delivered", "left", False, True)


async def test_a_press_that_never_arrives_is_given_up_after_the_bound(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Each look at the clock moves it a second on: the bound (5 s) passes within a few looks.
    done, fake = hands_with(monkeypatch, late=None, step=1.0)
    await done.run(a.Click(type="click", x=5, y=6))
    pressed = [c for c in fake.calls if c[0] == "button"]
    assert pressed == [("button", "left", True, False), ("button", "left", False, False)]
    assert len(fake.calls) < 20
    assert "did not reach its window within 5 s" in caplog.text
