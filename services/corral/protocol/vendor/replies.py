"""The vendor's own reply for a call: its result (``tool_result`` or ``item``), on success and failure."""

from __future__ import annotations

from typing import TypedDict

from corral.errors import ActionError
from corral.protocol.geometry import Scale
from corral.protocol.plan import ActionResult, EncodedImage, Step
from corral.protocol.vendor import anthropic_tools, openai_tools
from corral.protocol.vendor.calls import VendorCall


class VendorResult(TypedDict, total=False):
    """A vendor call's reply ``result``: Anthropic's ``tool_result`` block or OpenAI's output ``item``
    (an empty one when the vendor has none to give)."""

    tool_result: anthropic_tools.ToolResultBlock
    item: openai_tools.OutputItemParam


def success_result(
    call: VendorCall,
    steps: tuple[Step, ...],
    results: list[ActionResult],
    image: EncodedImage | None,
    scale: Scale | None,
) -> tuple[VendorResult, ActionError | None]:
    """A reply's ``result`` for a call whose steps ran, and the error it still reports (a shell_call
    whose commands timed out), else None."""
    if call.dialect == "anthropic":
        return {"tool_result": anthropic_tools.success(call, steps, results, image, scale)}, None
    item, error = openai_tools.success(call, steps, results, image)
    return ({} if item is None else {"item": item}), error


def failure_result(call: VendorCall, error: ActionError, image: EncodedImage | None = None) -> VendorResult | None:
    """A failed reply's ``result``: the vendor's error form of ``error``; None when the vendor has none
    (a computer_call without a screenshot)."""
    if call.dialect == "anthropic":
        return {"tool_result": anthropic_tools.failure(call, error)}
    item = openai_tools.failure(call, error, image)
    return None if item is None else {"item": item}
