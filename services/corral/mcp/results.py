"""What a tool answers, built from what the gateway said (pure): a result the model reads as text,
the same as ``structuredContent`` for programs, a screenshot as image content, and every refusal
as a tool error (``isError``) that carries Corral's code and message, so the model can read it and
the MCP session goes on."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from mcp_types import CallToolResult, ContentBlock, ImageContent, TextContent
from pydantic import BaseModel

from corral.client import Frame, Shot
from corral.errors import ActionFailed, CodedError, ErrorCode, RemoteError


def data(value: Mapping[str, object], summary: str | None = None) -> CallToolResult:
    """A JSON result: ``summary`` (else the JSON itself) as text, the JSON as structured content."""
    text = summary if summary is not None else json.dumps(value, ensure_ascii=False, indent=1)
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=dict(value))


def with_screenshot(result: BaseModel, summary: str, reply: Frame) -> CallToolResult:
    """An action's result model (``summary``, then its JSON if it has any), and the screenshot its
    reply carries (taken after the action), if any."""
    value: dict[str, object] = result.model_dump(mode="json")
    text = f"{summary}: {json.dumps(value, ensure_ascii=False)}" if value else summary
    result = data(value, text)
    image = screenshot_content(reply)
    if image is not None:
        result.content.append(image)
    return result


def with_hand_back(result: CallToolResult, reply: Frame) -> CallToolResult:
    """``result``, and the human's hand-back of the control lease if the reply carries one (its
    ``control`` member, sent once): a line for the model, ``control`` in the structured content."""
    handed = reply.get("control")
    if not isinstance(handed, Mapping):
        return result
    note = handed.get("note")
    how = "left" if handed.get("left") else "handed control back"
    text = f"{handed.get('by')} {how}" + (f" with a note: {note}" if note else "")
    result.content.append(TextContent(type="text", text=text))
    result.structured_content = {**(result.structured_content or {}), "control": dict(handed)}
    return result


def screenshot_content(reply: Frame) -> ImageContent | None:
    """The reply's screenshot as MCP image content (base64 as the reply has it)."""
    shot = reply.get("screenshot")
    if not isinstance(shot, Mapping) or not isinstance(shot.get("data"), str):
        return None
    return ImageContent(type="image", data=shot["data"], mime_type=str(shot.get("media_type") or "image/png"))


def image(reply: Frame) -> CallToolResult:
    """A screenshot's reply: the image, and its size as text and structured content."""
    shot = reply.get("screenshot") or Shot()
    size = {"width": shot.get("width"), "height": shot.get("height")}
    content: list[ContentBlock] = [TextContent(type="text", text=f"screenshot {size['width']}x{size['height']}")]
    picture = screenshot_content(reply)
    if picture is not None:
        content.append(picture)
    return CallToolResult(content=content, structured_content=size)


def error(code: str, message: str, field: str | None = None) -> CallToolResult:
    """A tool error: ``code: message`` for the model, ``{"error": {...}}`` for programs."""
    body: dict[str, str] = {"code": code, "message": message}
    if field:
        body["field"] = field
    text = f"{code}: {message}" + (f" (field {field})" if field else "")
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content={"error": body}, is_error=True
    )


def reply_error(reply: Frame) -> CallToolResult:
    """A sandbox's ``ok: false`` reply as a tool error."""
    body = reply.get("error")
    body = body if isinstance(body, Mapping) else {}
    field = body.get("field")
    return error(str(body.get("code") or "internal"), str(body.get("message") or ""), str(field) if field else None)


def refusal(exc: CodedError | RemoteError) -> CallToolResult:
    """A refusal raised on the way (the gateway's 401/403/404..., a sandbox's error) as a tool error,
    with the refusal's own message (not the exception's text, which repeats the status and code)."""
    if isinstance(exc, ActionFailed):
        return reply_error(Frame(error=dict(exc.error)))
    if isinstance(exc, RemoteError):
        message = str(exc).split(": ", 1)[-1] if exc.code else str(exc)
        return error(exc.code or "internal", message, exc.field)
    return error(str(exc.code), exc.message, exc.field)


def coded_sdk_refusal(wire: Mapping[str, Any], tool: str) -> dict[str, Any]:
    """A ``tools/call`` result in its wire form, with Corral's code added when the SDK answered it
    itself (an unknown tool, arguments off the tool's schema, a crash), so that every tool error
    has one: ``code: message`` as text and ``{"error": ...}`` as structured content. The tools' own
    errors already have theirs (:func:`error`), and a result that is no error stays as it is."""
    if not wire.get("isError") or "structuredContent" in wire:
        return dict(wire)
    blocks = wire.get("content") or []
    text = "\n".join(str(block.get("text", "")) for block in blocks if isinstance(block, Mapping))
    prefix = f"Error executing tool {tool}"
    if text.startswith("Unknown tool"):
        code, message = ErrorCode.UNKNOWN_TOOL, text
    elif text == prefix:  # a crash: the SDK keeps its text on the server
        code, message = ErrorCode.INTERNAL, f"{tool} failed; see the server's log"
    else:
        code, message = ErrorCode.INVALID_REQUEST, text.removeprefix(prefix + ": ")
    body = {"code": str(code), "message": message}
    return {**wire, "content": [{"type": "text", "text": f"{code}: {message}"}], "structuredContent": {"error": body}}


__all__ = [
    "coded_sdk_refusal",
    "data",
    "error",
    "image",
    "refusal",
    "reply_error",
    "screenshot_content",
    "with_screenshot",
]
