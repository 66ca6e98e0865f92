"""Replies checked against the vendors' own SDK param types (pydantic TypeAdapters over their TypedDicts).

A TypedDict's validation ignores unknown keys and ``Iterable`` fields validate lazily, so :func:`checked`
also drains every iterable (an invalid content block fails there) and the tests assert the exact keys.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from anthropic.types.beta import BetaToolResultBlockParam
from openai.types.responses import ResponseInputItemParam
from openai.types.responses.response_input_item_param import (
    ApplyPatchCallOutput,
    ComputerCallOutput,
    LocalShellCallOutput,
    ShellCallOutput,
)
from pydantic import TypeAdapter

TOOL_RESULT: TypeAdapter[Any] = TypeAdapter(BetaToolResultBlockParam)
INPUT_ITEM: TypeAdapter[Any] = TypeAdapter(ResponseInputItemParam)
ITEMS: dict[str, TypeAdapter[Any]] = {
    "computer_call_output": TypeAdapter(ComputerCallOutput),
    "shell_call_output": TypeAdapter(ShellCallOutput),
    "local_shell_call_output": TypeAdapter(LocalShellCallOutput),
    "apply_patch_call_output": TypeAdapter(ApplyPatchCallOutput),
}


def drained(value: Any) -> Any:
    """``value`` with every lazily validated iterable run through (raising what it finds)."""
    if isinstance(value, dict):
        return {key: drained(item) for key, item in value.items()}
    if isinstance(value, list | tuple | Iterator):
        return [drained(item) for item in value]
    return value


def checked_tool_result(block: dict[str, Any]) -> dict[str, Any]:
    """``block``, once validated (strict) as a ``BetaToolResultBlockParam``, content and all."""
    out = drained(TOOL_RESULT.validate_python(block, strict=True))
    assert out == block  # nothing coerced, nothing dropped
    return block


def checked_item(item: dict[str, Any]) -> dict[str, Any]:
    """``item``, once validated (strict) as its own ``ResponseInputItemParam`` member and as the union."""
    out = drained(ITEMS[item["type"]].validate_python(item, strict=True))
    assert out == item
    assert drained(INPUT_ITEM.validate_python(item, strict=True)) == item
    return item
