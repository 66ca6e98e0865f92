"""Vendor tools verbatim: an Anthropic ``tool_use`` block or an OpenAI output item in, the vendor's own
result block or input item out, success and failure alike. Pure translators and reply builders (no I/O);
the dispatcher runs the native actions in between.

What tells a vendor call apart (:mod:`.calls`, no models) loads with the package; the translators and
reply builders, whose models cost a cold start tens of milliseconds, on first use (docs/design/0470).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from corral.protocol.vendor.calls import VendorCall, call_of, is_block, is_item

if TYPE_CHECKING:
    from corral.protocol.vendor.replies import failure_result, success_result
    from corral.protocol.vendor.steps import (
        answers_each_step,
        default_screenshot,
        next_action,
        request_field,
        translate,
    )

_LAZY = {
    **dict.fromkeys(("failure_result", "success_result"), "corral.protocol.vendor.replies"),
    **dict.fromkeys(
        ("answers_each_step", "default_screenshot", "next_action", "request_field", "translate"),
        "corral.protocol.vendor.steps",
    ),
}

__all__ = [
    "VendorCall",
    "answers_each_step",
    "call_of",
    "default_screenshot",
    "failure_result",
    "is_block",
    "is_item",
    "next_action",
    "request_field",
    "success_result",
    "translate",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'corral.protocol.vendor' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
