"""Vendor tools verbatim: an Anthropic ``tool_use`` block or an OpenAI output item in, the vendor's own
result block or input item out, success and failure alike. Pure translators and reply builders (no I/O);
the dispatcher runs the native actions in between."""

from corral.protocol.vendor.calls import VendorCall, call_of, is_block, is_item
from corral.protocol.vendor.replies import failure_result, success_result
from corral.protocol.vendor.steps import answers_each_step, default_screenshot, next_action, request_field, translate

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
