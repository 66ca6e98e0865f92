"""The wire protocol: native actions, the Anthropic and OpenAI dialects, envelopes and replies.

The names below load on first use: a client reads replies with :mod:`corral.protocol.results`
(pydantic only) without loading the actions' key tables (python-xlib, a server dependency).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.protocol.actions import ACTION_TYPES, NativeAction, Region, ScreenshotOptions
    from corral.protocol.envelope import Limits, decode, plan_request, request_id_of
    from corral.protocol.geometry import Scale, Size
    from corral.protocol.plan import ActionResult, After, Dialect, EncodedImage, Plan, Step

_LAZY = {
    **dict.fromkeys(("ACTION_TYPES", "NativeAction", "Region", "ScreenshotOptions"), "corral.protocol.actions"),
    **dict.fromkeys(("Limits", "decode", "plan_request", "request_id_of"), "corral.protocol.envelope"),
    **dict.fromkeys(("Scale", "Size"), "corral.protocol.geometry"),
    **dict.fromkeys(("ActionResult", "After", "Dialect", "EncodedImage", "Plan", "Step"), "corral.protocol.plan"),
}

__all__ = [
    "ACTION_TYPES",
    "ActionResult",
    "After",
    "Dialect",
    "EncodedImage",
    "Limits",
    "NativeAction",
    "Plan",
    "Region",
    "Scale",
    "ScreenshotOptions",
    "Size",
    "Step",
    "decode",
    "plan_request",
    "request_id_of",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'corral.protocol' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
