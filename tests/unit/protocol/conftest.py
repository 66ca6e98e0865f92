"""Shared helpers for the protocol tests: a 1280x800 screen, default limits, planning and failing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from corral.errors import ActionError
from corral.protocol import Limits, Plan, Size, plan_request

SCREEN = Size(1280, 800)

PlanFn = Callable[..., Plan]
FailFn = Callable[..., ActionError]


@pytest.fixture
def screen() -> Size:
    return SCREEN


@pytest.fixture
def limits() -> Limits:
    return Limits()


@pytest.fixture
def plan(limits: Limits) -> PlanFn:
    """``plan(message, screen=...)``: the Plan for a decoded message."""

    def _plan(obj: dict[str, Any], screen: Size = SCREEN, lim: Limits | None = None) -> Plan:
        return plan_request(obj, screen, lim or limits)

    return _plan


@pytest.fixture
def fail(limits: Limits) -> FailFn:
    """``fail(message, screen=...)``: the ActionError plan_request raises for a bad message."""

    def _fail(obj: dict[str, Any], screen: Size = SCREEN, lim: Limits | None = None) -> ActionError:
        with pytest.raises(ActionError) as info:
            plan_request(obj, screen, lim or limits)
        return info.value

    return _fail
