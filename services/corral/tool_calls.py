"""The vendors' tool calls from the client side (pure): a Messages ``tool_use`` block or a Responses
output item as the dict Corral takes, every call of a whole model reply in order, and the vendor's
own result read back from Corral's reply.

The SDK's ``sb.anthropic``, ``sb.openai`` and ``sb.tool_results`` send these (docs/protocol.md,
"Vendor tools"). The vendors' SDK objects are taken as they come (anything with ``model_dump``,
dumped as JSON without its unset fields): the ``anthropic`` and ``openai`` packages are never
imported here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from corral.client import Frame
from corral.errors import ActionFailed, CorralError

# The Responses API's output items Corral serves; a reply's other items (messages, reasoning,
# function calls) are the caller's own.
# corral.protocol.vendor.calls.OPENAI_ITEMS too, which the SDK does not import (a test holds them equal).
OPENAI_CALLS = ("computer_call", "shell_call", "local_shell_call", "apply_patch_call")

Dialect = Literal["anthropic", "openai"]
# Called with Corral's structured error when a call failed and the reply still holds the vendor's
# own error form (the result the model reads); what it returns is ignored.
OnError = Callable[[ActionFailed], object]


class SupportsModelDump(Protocol):
    """A vendor SDK's object: a pydantic model (``BetaToolUseBlock``, ``ResponseFunctionShellToolCall``,
    ``BetaMessage``, ``Response``, ...)."""

    def model_dump(self, *, mode: str = ..., exclude_none: bool = ...) -> dict[str, Any]: ...


# A block, an item, or a whole reply: a dict, or the vendor SDK's object for it.
Vendored = Mapping[str, Any] | SupportsModelDump
# A whole model reply (``BetaMessage``, ``Message``, ``Response`` or their dicts), or its list of
# content blocks or output items.
ModelReply = Vendored | Sequence[Vendored]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One vendor tool call as Corral takes it: ``{dialect: call}`` in the request, and the key of
    the vendor's result in the reply's ``result``."""

    dialect: Dialect
    call: dict[str, Any]

    @property
    def result_key(self) -> str:
        return "tool_result" if self.dialect == "anthropic" else "item"


def as_dict(obj: object, what: str) -> dict[str, Any]:
    """A dict of ``obj``: a mapping as it is, a vendor SDK object through ``model_dump``."""
    if isinstance(obj, Mapping):
        return dict(obj)
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        dumped = dump(mode="json", exclude_none=True)
        if isinstance(dumped, dict):
            return dumped
    raise CorralError(f"{what} must be a dict or a vendor SDK object (with model_dump), not {type(obj).__name__}")


def anthropic_call(block: object) -> ToolCall:
    """A Messages ``tool_use`` block (``type``, ``id``, ``name``, ``input``, ``toolset_name``?) to send."""
    call = as_dict(block, "an Anthropic tool_use block")
    if call.get("type") != "tool_use":
        raise CorralError(
            f"not a tool_use block (type {call.get('type')!r}); a bare computer-tool input goes to run_anthropic"
        )
    return ToolCall("anthropic", call)


def openai_call(item: object) -> ToolCall:
    """A Responses output item Corral serves (one of :data:`OPENAI_CALLS`) to send."""
    call = as_dict(item, "an OpenAI output item")
    if call.get("type") not in OPENAI_CALLS:
        raise CorralError(
            f"not an output item Corral serves (type {call.get('type')!r}; one of {', '.join(OPENAI_CALLS)}); "
            "a bare computer action goes to run_openai"
        )
    return ToolCall("openai", call)


def calls_of(reply: ModelReply) -> list[ToolCall]:
    """Every tool call of a whole model reply, in order: a Messages reply's ``tool_use`` blocks
    (``content``), or a Responses reply's served items (``output``; others passed over). A list of
    blocks or items is taken too."""
    if isinstance(reply, Sequence) and not isinstance(reply, str | bytes):
        parts = [as_dict(part, "a content block or output item") for part in reply]
    else:
        whole = as_dict(reply, "a Messages or Responses reply")
        found = whole.get("content") if isinstance(whole.get("content"), list) else whole.get("output")
        if not isinstance(found, list):
            raise CorralError("neither a Messages reply (content: [...]) nor a Responses reply (output: [...])")
        parts = [as_dict(part, "a content block or output item") for part in found]
    calls: list[ToolCall] = []
    for part in parts:
        if part.get("type") == "tool_use":
            calls.append(ToolCall("anthropic", part))
        elif part.get("type") in OPENAI_CALLS:
            calls.append(ToolCall("openai", part))
    return calls


def vendor_result(reply: Frame, key: str, on_error: OnError | None = None) -> dict[str, Any]:
    """The vendor's result in Corral's reply (``result.tool_result`` or ``result.item``), a failure's
    error form included: the model reads it. ``on_error`` hears Corral's structured error then.
    Raises :class:`ActionFailed` for a failure with no vendor result (the call could not be read)."""
    result = reply.get("result")
    found = result.get(key) if isinstance(result, dict) else None
    if isinstance(found, dict):
        if not reply.get("ok") and on_error is not None:
            on_error(ActionFailed(reply.get("error") or {}))
        return found
    if not reply.get("ok"):
        raise ActionFailed(reply.get("error") or {})
    raise CorralError(f"the sandbox's reply holds no result.{key}: is the sandbox older than the vendor tools?")


__all__ = [
    "OPENAI_CALLS",
    "Dialect",
    "ModelReply",
    "OnError",
    "SupportsModelDump",
    "ToolCall",
    "Vendored",
    "anthropic_call",
    "as_dict",
    "calls_of",
    "openai_call",
    "vendor_result",
]
