"""Reading a request's vendor call: which tool, which call id, what the reply echoes; never raising."""

from __future__ import annotations

from typing import Any

import pytest
from anthropic.types.beta import BetaToolUseBlock
from openai.types.responses import ResponseComputerToolCall, ResponseFunctionShellToolCall

from corral.protocol.vendor import VendorCall, call_of, is_block, is_item


def test_an_anthropic_block_is_read_as_the_sdk_dumps_it() -> None:
    block = BetaToolUseBlock(id="toolu_1", name="left_click", input={}, type="tool_use", toolset_name="computer")
    call = call_of({"id": 1, "anthropic": block.model_dump()})
    assert call == VendorCall(dialect="anthropic", tool="left_click", call_id="toolu_1", toolset_name="computer")
    assert call.member and call.computer


@pytest.mark.parametrize(
    ("name", "toolset", "member", "computer"),
    [
        ("computer", None, False, True),
        ("zoom", "computer", True, True),
        ("zoom", None, False, False),  # a member name without the toolset is no computer call
        ("bash", None, False, False),
        ("bash", "agent_toolset_20260401", False, False),
    ],
)
def test_which_anthropic_calls_are_on_the_screen(name: str, toolset: str | None, member: bool, computer: bool) -> None:
    call = call_of({"anthropic": {"type": "tool_use", "id": "t", "name": name, "input": {}, "toolset_name": toolset}})
    assert call is not None
    assert (call.member, call.computer) == (member, computer)


def test_an_openai_shell_call_keeps_its_output_cut() -> None:
    item = ResponseFunctionShellToolCall(
        id="sh_1",
        call_id="call_1",
        type="shell_call",
        status="completed",
        action={"commands": ["ls"], "max_output_length": 100, "timeout_ms": 5000},  # type: ignore[arg-type]
    )
    call = call_of({"openai": item.model_dump()})
    assert call == VendorCall(dialect="openai", tool="shell_call", call_id="call_1", max_output_length=100)
    assert not call.computer


def _computer_call(checks: list[dict[str, Any]]) -> dict[str, Any]:
    return ResponseComputerToolCall.model_validate(
        {
            "id": "cu_1",
            "call_id": "call_9",
            "type": "computer_call",
            "status": "completed",
            "pending_safety_checks": checks,
            "action": {"type": "screenshot"},
        }
    ).model_dump()


def test_pending_safety_checks_are_acknowledged_only_when_the_request_says() -> None:
    item = _computer_call([{"id": "sc_1", "code": "malicious_instructions", "message": "careful"}, {"id": "sc_2"}])
    assert call_of({"openai": item}) == VendorCall(dialect="openai", tool="computer_call", call_id="call_9")
    call = call_of({"openai": item, "acknowledge_safety_checks": True})
    assert call is not None and call.computer
    # ``code`` and ``message`` are left out when the API left them unset (None).
    assert call.acknowledged == ({"id": "sc_1", "code": "malicious_instructions", "message": "careful"}, {"id": "sc_2"})


@pytest.mark.parametrize(
    "request_",
    [
        "text",
        None,
        [],
        {},
        {"anthropic": {"action": "screenshot"}},  # today's bare computer input
        {"anthropic": {"type": "tool_use", "name": "bash"}},  # no id
        {"anthropic": {"type": "tool_use", "id": 5, "name": "bash"}},
        {"openai": {"type": "click", "x": 1, "y": 1}},  # today's action form
        {"openai": [{"type": "screenshot"}]},  # today's batch
        {"openai": {"type": "function_call", "call_id": "c"}},  # an item Corral does not serve
        {"openai": {"type": "shell_call", "call_id": None}},
        {
            "openai": {"type": "computer_call", "call_id": "c", "pending_safety_checks": "x"},
            "acknowledge_safety_checks": 1,
        },
    ],
)
def test_anything_else_is_no_vendor_call_or_no_ack(request_: Any) -> None:
    call = call_of(request_)
    assert call is None or call.acknowledged == ()


def test_a_call_with_an_unreadable_name_still_has_its_id() -> None:
    call = call_of({"anthropic": {"type": "tool_use", "id": "t", "name": ["x"], "input": None}})
    assert call == VendorCall(dialect="anthropic", tool="", call_id="t")


def test_forms() -> None:
    assert is_block({"type": "tool_use"}) and not is_block({"action": "key"}) and not is_block([])
    assert all(is_item({"type": t}) for t in ("computer_call", "shell_call", "local_shell_call", "apply_patch_call"))
    assert not is_item({"type": "click"}) and not is_item("computer_call")
