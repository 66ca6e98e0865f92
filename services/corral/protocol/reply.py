"""Server-to-client messages: one success or failure reply per request.

A reply's first key is always ``ok``: :func:`encode` guarantees it, so the gateway tells a failure
from a frame's first bytes (:func:`failed`) without parsing a screenshot's megabytes.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict

from corral.errors import ActionError
from corral.protocol.plan import ActionResult, Dialect, EncodedImage, Plan, RequestId
from corral.protocol.vendor.calls import VendorCall

# The dialects' and the vendors' reply builders are imported in the branch that needs them: a native
# session never builds their models (docs/design/0470).


class ImageBlock(TypedDict):
    """A reply's ``screenshot``: the image's data only where the result cannot hold it."""

    media_type: str
    width: int
    height: int
    data: NotRequired[str]  # base64
    settle_ms: NotRequired[float]
    settled: NotRequired[bool | None]


class Reply(TypedDict):
    """One reply, in the order its keys go on the wire (:func:`encode` puts ``ok`` first whatever
    the order): ``ok`` and ``id`` always; ``error`` on a failure; ``result``, ``screenshot`` and
    ``elapsed_ms`` on a success (a vendor call's failure has a ``result`` too); the dispatcher adds
    ``action_id`` and, when a human handed the lease back, ``control``."""

    ok: bool
    id: RequestId
    error: NotRequired[Mapping[str, object]]  # corral.errors.CodedError.to_dict
    # The action's result (corral.protocol.results, as its wire() gives it), the dialects' payload, or
    # a vendor's own block or item: JSON whose shape the vendor owns, so left open here.
    result: NotRequired[Mapping[str, Any]]
    screenshot: NotRequired[ImageBlock]
    elapsed_ms: NotRequired[float]
    action_id: NotRequired[str]
    control: NotRequired[Mapping[str, object]]  # corral.protocol.results.HandBack's wire()


def _image_block(image: EncodedImage, with_data: bool) -> ImageBlock:
    block = ImageBlock(media_type=image.media_type, width=image.width, height=image.height)
    if with_data:
        block["data"] = base64.b64encode(image.data).decode()
    if image.settle_ms is not None:
        block["settle_ms"] = round(image.settle_ms, 1)
        block["settled"] = image.settled
    return block


def success(plan: Plan, results: list[ActionResult], image: EncodedImage | None, elapsed_ms: float) -> Reply:
    """The ``ok: true`` reply; dialect envelopes carry their payload in ``result`` and the image there when
    it can hold one (a shell_call's output cannot: then the reply's ``screenshot`` has the data).

    A vendor call's ``result`` is its ``tool_result`` or ``item``; a shell_call whose commands timed out
    still answers ``ok: false`` (code ``timeout``) beside the item that says which.
    """
    reply = Reply(ok=True, id=plan.request_id)
    if plan.call is not None:
        from corral.protocol.vendor.replies import success_result

        result, error = success_result(plan.call, plan.steps, results, image, plan.scale)
        reply["result"] = result
        if error is not None:
            reply = Reply(ok=False, id=plan.request_id, error=error.to_dict(), result=result)
    elif plan.dialect is Dialect.NATIVE:
        reply["result"] = results[-1].data
    elif plan.dialect is Dialect.ANTHROPIC:
        from corral.protocol import anthropic

        content = anthropic.tool_result_content(plan.steps[-1].action, results[-1], image, plan.scale)
        reply["result"] = {"tool_result_content": content}
    else:
        from corral.protocol import openai

        reply["result"] = {"output": openai.call_output(image)} if image is not None else {}
    if image is not None:
        in_result = plan.dialect is not Dialect.NATIVE and (plan.call is None or plan.call.holds_images)
        reply["screenshot"] = _image_block(image, with_data=not in_result)
    reply["elapsed_ms"] = round(elapsed_ms, 2)
    return reply


def failure(
    request_id: RequestId, error: ActionError, call: VendorCall | None = None, image: EncodedImage | None = None
) -> Reply:
    """The ``ok: false`` reply; for a vendor call also its ``result`` in the vendor's own error form
    (``image``: a computer_call's current screenshot, the only output that call can have)."""
    reply = Reply(ok=False, id=request_id, error=error.to_dict())
    if call is None:
        return reply
    from corral.protocol.vendor.replies import failure_result

    result = failure_result(call, error, image)
    if result is not None:
        reply["result"] = result
    return reply


_FAILED = '{"ok":false,'
_FAILED_BYTES = _FAILED.encode()


def encode(reply: Reply) -> str:
    """A reply as one compact JSON text that starts with its ``ok`` (whatever order ``reply`` has)."""
    return json.dumps({"ok": bool(reply["ok"]), **reply}, separators=(",", ":"))


def failed(frame: str | bytes) -> bool:
    """Whether an :func:`encode`-d reply is a failure, from its first bytes alone."""
    return frame.startswith(_FAILED) if isinstance(frame, str) else frame.startswith(_FAILED_BYTES)


def error_code(frame: str | bytes) -> str | None:
    """The error code of an :func:`encode`-d failure (small: parsed whole); None for a success."""
    if not failed(frame):
        return None
    try:
        return str(json.loads(frame)["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return None
