"""A request's vendor call: which vendor tool a whole tool_use block or output item asks for, and what its
reply must echo (the call id, the toolset, the acknowledged safety checks, the output cut).

:func:`call_of` reads it from the raw request before anything is validated, so that even a request that
fails to plan is answered in the vendor's own error form whenever its call id could be read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict, TypeGuard

VendorDialect = Literal["anthropic", "openai"]

ANTHROPIC_BLOCK = "tool_use"
OPENAI_ITEMS = ("computer_call", "shell_call", "local_shell_call", "apply_patch_call")

COMPUTER_TOOL = "computer"
COMPUTER_TOOLSET = "computer"
COMPUTER_MEMBERS = (
    "key",
    "hold_key",
    "type",
    "cursor_position",
    "mouse_move",
    "left_mouse_down",
    "left_mouse_up",
    "left_click",
    "left_click_drag",
    "right_click",
    "middle_click",
    "double_click",
    "triple_click",
    "scroll",
    "wait",
    "screenshot",
    "zoom",
)


class SafetyCheck(TypedDict):
    """An ``acknowledged_safety_checks`` entry: a pending check's id (its code and message when set)."""

    id: str
    code: NotRequired[str]
    message: NotRequired[str]


@dataclass(frozen=True, slots=True)
class VendorCall:
    """One vendor tool call as the reply needs it.

    ``tool`` is the Anthropic block's ``name`` or the OpenAI item's ``type``; ``call_id`` the block's
    ``id`` or the item's ``call_id``. ``acknowledged`` holds the computer_call's pending safety checks
    when the request said ``acknowledge_safety_checks``; ``max_output_length`` is a shell_call's.
    """

    dialect: VendorDialect
    tool: str
    call_id: str
    toolset_name: str | None = None
    acknowledged: tuple[SafetyCheck, ...] = ()
    max_output_length: int | None = None

    @property
    def member(self) -> bool:
        """A member of Anthropic's computer toolset (its own block per action)."""
        return self.dialect == "anthropic" and self.toolset_name == COMPUTER_TOOLSET and self.tool in COMPUTER_MEMBERS

    @property
    def holds_images(self) -> bool:
        """Whether the reply's ``result`` can carry a screenshot: every Anthropic tool_result can, and of
        OpenAI's outputs only a computer_call's (elsewhere the image rides in the reply's ``screenshot``)."""
        return self.dialect == "anthropic" or self.tool == "computer_call"

    @property
    def computer(self) -> bool:
        """A call on the screen (a computer tool): its reply carries a screenshot by default."""
        if self.dialect == "openai":
            return self.tool == "computer_call"
        return self.tool == COMPUTER_TOOL or self.member


# A vendor's call as it came (the block or item JSON the model gave): read field by field, never trusted.
def is_block(value: Any) -> TypeGuard[dict[str, Any]]:
    """An Anthropic ``tool_use`` block (any other ``anthropic`` payload is the bare computer input)."""
    return isinstance(value, dict) and value.get("type") == ANTHROPIC_BLOCK


def is_item(value: Any) -> TypeGuard[dict[str, Any]]:
    """An OpenAI output item we serve (any other ``openai`` payload is an action or a batch)."""
    return isinstance(value, dict) and value.get("type") in OPENAI_ITEMS


def call_of(obj: Any) -> VendorCall | None:
    """The vendor call a decoded request holds, or None (not a vendor call, or no readable call id).

    Never raises: it runs on requests that failed to validate.
    """
    if not isinstance(obj, dict):
        return None
    block, item = obj.get("anthropic"), obj.get("openai")
    if is_block(block):
        return _anthropic_call(block)
    if is_item(item):
        return _openai_call(item, obj.get("acknowledge_safety_checks") is True)
    return None


def _anthropic_call(block: dict[str, Any]) -> VendorCall | None:
    call_id, name, toolset = block.get("id"), block.get("name"), block.get("toolset_name")
    if not isinstance(call_id, str):
        return None
    return VendorCall(
        dialect="anthropic",
        tool=name if isinstance(name, str) else "",
        call_id=call_id,
        toolset_name=toolset if isinstance(toolset, str) else None,
    )


def _openai_call(item: dict[str, Any], acknowledge: bool) -> VendorCall | None:
    call_id = item.get("call_id")
    if not isinstance(call_id, str):
        return None
    kind = str(item["type"])
    action = item.get("action")
    limit = action.get("max_output_length") if kind == "shell_call" and isinstance(action, dict) else None
    checks = _checks(item.get("pending_safety_checks")) if acknowledge and kind == "computer_call" else ()
    return VendorCall(
        dialect="openai",
        tool=kind,
        call_id=call_id,
        acknowledged=checks,
        max_output_length=limit if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0 else None,
    )


def _checks(pending: Any) -> tuple[SafetyCheck, ...]:
    """The pending safety checks as ``acknowledged_safety_checks`` entries (id, and code/message when set)."""
    if not isinstance(pending, list):
        return ()
    checks: list[SafetyCheck] = []
    for check in pending:
        if isinstance(check, dict) and isinstance(check.get("id"), str):
            entry: SafetyCheck = {"id": check["id"]}
            if isinstance(check.get("code"), str):
                entry["code"] = check["code"]
            if isinstance(check.get("message"), str):
                entry["message"] = check["message"]
            checks.append(entry)
    return tuple(checks)
