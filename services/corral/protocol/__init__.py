"""The wire protocol: native actions, the Anthropic and OpenAI dialects, envelopes and replies."""

from corral.protocol.actions import ACTION_TYPES, NativeAction, Region, ScreenshotOptions
from corral.protocol.envelope import Limits, decode, plan_request, request_id_of
from corral.protocol.geometry import Scale, Size
from corral.protocol.plan import ActionResult, After, Dialect, EncodedImage, Plan, Step

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
