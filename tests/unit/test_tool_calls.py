"""The vendors' tool calls from the client side, pure: what is taken as a call, what a whole reply's
calls are, and how a reply is read (the SDK's side is tests/unit/test_sdk_tools.py)."""

from __future__ import annotations

from typing import Any

import pytest
from anthropic.types.beta import BetaToolUseBlock
from openai.types.responses import ResponseApplyPatchToolCall

from corral.errors import ActionFailed, CorralError
from corral.tool_calls import ToolCall, anthropic_call, as_dict, calls_of, openai_call, vendor_result

BLOCK = {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls", "restart": None}}
PATCH = {
    "type": "apply_patch_call",
    "id": "ap_1",
    "call_id": "call_1",
    "status": "completed",
    "operation": {"type": "delete_file", "path": "/workspace/gone.txt"},
}


def test_an_sdk_object_is_dumped_as_json_without_its_unset_fields_and_its_input_verbatim() -> None:
    assert as_dict(BetaToolUseBlock.model_validate(BLOCK), "a block") == BLOCK  # caller: None left out
    assert as_dict(ResponseApplyPatchToolCall.model_validate(PATCH), "an item") == PATCH
    assert anthropic_call(BLOCK) == ToolCall("anthropic", BLOCK)
    assert openai_call(PATCH).result_key == "item" and anthropic_call(BLOCK).result_key == "tool_result"


class NotAModel:
    def model_dump(self, **_: Any) -> list[int]:
        return [1]


@pytest.mark.parametrize("given", [42, NotAModel(), None])
def test_what_is_neither_a_dict_nor_a_model_is_refused(given: object) -> None:
    with pytest.raises(CorralError, match="must be a dict or a vendor SDK object"):
        as_dict(given, "a block")


def test_a_reply_is_a_messages_or_responses_reply_or_a_list_of_their_parts() -> None:
    assert calls_of({"content": [{"type": "text", "text": "hi"}, BLOCK]}) == [ToolCall("anthropic", BLOCK)]
    assert calls_of({"output": [{"type": "reasoning", "id": "r", "summary": []}, PATCH]}) == [ToolCall("openai", PATCH)]
    assert calls_of([PATCH, BLOCK, {"type": "server_tool_use"}]) == [
        ToolCall("openai", PATCH),
        ToolCall("anthropic", BLOCK),
    ]
    assert calls_of({"content": [], "output": [PATCH]}) == []  # a Messages reply with no calls: its content decides
    with pytest.raises(CorralError, match="neither a Messages reply"):
        calls_of({"choices": []})


ERROR = {"code": "patch_failed", "message": "context not found: 'def f'"}
FAILED = {"type": "apply_patch_call_output", "call_id": "call_1", "status": "failed", "output": "context not found"}


def test_a_reply_is_read_as_the_vendor_result_whether_ok_or_not() -> None:
    heard: list[ActionFailed] = []
    ok = {"ok": True, "id": 1, "result": {"item": FAILED}}
    assert vendor_result(ok, "item", heard.append) == FAILED and heard == []  # ok: the hook is not called
    failed = {"ok": False, "id": 1, "error": ERROR, "result": {"item": FAILED}}
    assert vendor_result(failed, "item", heard.append) == FAILED
    assert vendor_result(failed, "item") == FAILED
    assert [(e.code, str(e)) for e in heard] == [("patch_failed", "patch_failed: context not found: 'def f'")]
    with pytest.raises(ActionFailed, match="patch_failed"):
        vendor_result({"ok": False, "id": 1, "error": ERROR}, "item")
    with pytest.raises(ActionFailed, match="patch_failed"):
        vendor_result({"ok": False, "id": 1, "error": ERROR, "result": {"tool_result": {}}}, "item")


def test_the_client_sends_the_items_the_controller_serves() -> None:
    # Two copies on purpose: the SDK does not import corral.protocol (its pydantic models cost start-up).
    from corral.protocol.vendor.calls import ANTHROPIC_BLOCK, OPENAI_ITEMS
    from corral.tool_calls import OPENAI_CALLS

    assert OPENAI_CALLS == OPENAI_ITEMS and BLOCK["type"] == ANTHROPIC_BLOCK
