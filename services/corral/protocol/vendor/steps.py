"""A vendor call's native steps: the translators by dialect, the default screenshot, and the order
the runner follows (a shell_call's shared budget)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from corral.protocol import actions as a
from corral.protocol.geometry import Size
from corral.protocol.plan import ActionResult, Step
from corral.protocol.vendor import anthropic_tools, openai_tools
from corral.protocol.vendor.calls import VendorCall


def translate(dialect: str, payload: Any, display: Size) -> list[Step]:
    """The native steps of the ``anthropic`` block or ``openai`` item ``payload``; ``display`` is the
    screen size the model sees."""
    if dialect == "anthropic":
        return anthropic_tools.translate(anthropic_tools.read_block(payload), display)
    return openai_tools.translate(openai_tools.read_item(payload))


def default_screenshot(dialect: str, payload: Any) -> bool:
    """Whether the reply carries a screenshot unless the envelope says: the computer tools' calls."""
    if dialect == "anthropic":
        return anthropic_tools.default_screenshot(payload)
    return openai_tools.default_screenshot(payload)


def next_action(
    call: VendorCall | None, action: a.NativeAction, ran: Sequence[ActionResult], spent_ms: float
) -> a.NativeAction | None:
    """The action the runner runs next (as planned, or with what is left of a shared budget), or None
    to stop here; the reply builders read which steps ran from the results."""
    if call is None or call.dialect != "openai":
        return action
    return openai_tools.next_action(call, action, ran, spent_ms)


def answers_each_step(call: VendorCall | None) -> bool:
    """Whether a step that fails becomes its own entry in the reply (a shell_call's commands) rather
    than failing the whole call."""
    return call is not None and call.dialect == "openai" and openai_tools.answers_each_step(call)


def request_field(call: VendorCall | None, step_field: str, native: str | None) -> str | None:
    """The field a native action's error names, as the request named it: ``action.x`` under the
    step's own field (as the desktop steps' errors are), a shell_call's exec fields as its own."""
    if native is None or not native.startswith("action.") or step_field == "action":
        return native
    if call is not None and call.dialect == "openai":
        return openai_tools.request_field(call, step_field, native)
    return step_field + native[len("action") :]
