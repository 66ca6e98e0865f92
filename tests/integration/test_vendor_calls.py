"""Whole vendor blocks and items against the real sandbox: the vendors' own replies (checked against their
SDKs' param types) on success and failure, for the tools whose native actions exist in this tree."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

from anthropic.types.beta import BetaToolResultBlockParam, BetaToolUseBlock
from openai.types.responses import (
    ResponseComputerToolCall,
    ResponseFunctionShellToolCall,
    ResponseInputItemParam,
)
from openai.types.responses.response_output_item import LocalShellCall
from pydantic import TypeAdapter

from corral.client import SandboxClient

from .conftest import decode_image

TOOL_RESULT: TypeAdapter[Any] = TypeAdapter(BetaToolResultBlockParam)
INPUT_ITEM: TypeAdapter[Any] = TypeAdapter(ResponseInputItemParam)


def _drained(value: Any) -> Any:
    """``value`` with every lazily validated iterable of a TypedDict run through."""
    if isinstance(value, dict):
        return {key: _drained(item) for key, item in value.items()}
    if isinstance(value, list | tuple | Iterator):
        return [_drained(item) for item in value]
    return value


def checked_tool_result(block: dict[str, Any]) -> dict[str, Any]:
    assert _drained(TOOL_RESULT.validate_python(block, strict=True)) == block
    return block


def checked_item(item: dict[str, Any]) -> dict[str, Any]:
    assert _drained(INPUT_ITEM.validate_python(item, strict=True)) == item
    return item


def _block(name: str, inp: dict[str, Any], toolset: str | None = None) -> dict[str, Any]:
    return BetaToolUseBlock(
        id="toolu_" + uuid.uuid4().hex[:8], name=name, input=inp, type="tool_use", toolset_name=toolset
    ).model_dump()


def test_a_computer_toolset_zoom_fills_the_image_budget(client: SandboxClient) -> None:
    block = _block("zoom", {"region": [0, 0, 320, 200]}, toolset="computer")
    reply = client.request({"anthropic": block})
    assert reply["ok"], reply
    result = checked_tool_result(reply["result"]["tool_result"])
    assert result["tool_use_id"] == block["id"] and result["toolset_name"] == "computer"
    (image,) = result["content"]
    assert decode_image(image["source"]["data"]).size == (1280, 800)  # a quarter of the screen, scaled up 4x


def test_an_unknown_tool_answers_is_error_and_the_session_keeps_working(client: SandboxClient) -> None:
    block = _block("web_fetch", {"url": "https://example.test/"})
    reply = client.request({"anthropic": block})
    assert reply["ok"] is False and reply["error"]["code"] == "unknown_tool"
    result = checked_tool_result(reply["result"]["tool_result"])
    assert result["is_error"] is True and result["content"] == [{"type": "text", "text": reply["error"]["message"]}]
    assert client.request({"anthropic": _block("cursor_position", {}, toolset="computer")})["ok"]


def test_an_anthropic_write_lands_in_the_workspace(client: SandboxClient) -> None:
    name = f"vendor-{uuid.uuid4().hex[:8]}/note.txt"
    reply = client.request({"anthropic": _block("write", {"file_path": name, "content": "hello\n"})})
    assert reply["ok"], reply
    text = checked_tool_result(reply["result"]["tool_result"])["content"][0]["text"]
    assert text == f"Wrote 6 bytes to /workspace/{name}"
    assert client.act({"type": "file_read", "path": name})["result"]["content"] == "hello\n"


def _shell_call(commands: list[str], **limits: Any) -> dict[str, Any]:
    item = {"id": "sh_1", "call_id": "call_" + uuid.uuid4().hex[:8], "type": "shell_call", "status": "completed"}
    return ResponseFunctionShellToolCall.model_validate(
        {**item, "action": {"commands": commands, **limits}}
    ).model_dump()


def test_a_shell_call_runs_each_command_as_the_agent(client: SandboxClient) -> None:
    item = _shell_call(["id -un", "echo out; echo err >&2; exit 3"], max_output_length=100)
    reply = client.request({"openai": item})
    assert reply["ok"], reply
    output = checked_item(reply["result"]["item"])
    assert output["call_id"] == item["call_id"] and output["max_output_length"] == 100
    assert output["output"] == [
        {"stdout": "agent\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}},
        {"stdout": "out\n", "stderr": "err\n", "outcome": {"type": "exit", "exit_code": 3}},
    ]


def test_a_shell_call_over_its_budget_reports_timeouts(client: SandboxClient) -> None:
    reply = client.request({"openai": _shell_call(["echo first", "sleep 30", "echo never"], timeout_ms=1500)})
    assert reply["ok"] is False and reply["error"]["code"] == "timeout", reply
    outcomes = [entry["outcome"] for entry in checked_item(reply["result"]["item"])["output"]]
    assert outcomes == [{"type": "exit", "exit_code": 0}, {"type": "timeout"}, {"type": "timeout"}]
    assert client.request({"openai": _shell_call(["true"])})["ok"]  # the session keeps working


def test_a_local_shell_call(client: SandboxClient) -> None:
    action = {
        "type": "exec",
        "command": ["sh", "-c", "echo $GREETING; pwd"],
        "env": {"GREETING": "hi"},
        "working_directory": "/tmp",
    }
    item = LocalShellCall.model_validate(
        {"id": "ls_1", "call_id": "call_l", "type": "local_shell_call", "status": "completed", "action": action}
    ).model_dump()
    reply = client.request({"openai": item})
    assert reply["ok"], reply
    output = checked_item(reply["result"]["item"])
    assert output["id"] == "call_l"
    body = json.loads(output["output"])
    assert body["output"] == "hi\n/tmp\n" and body["metadata"]["exit_code"] == 0
    refused = client.request({"openai": {**item, "action": {**action, "user": "root"}}})
    assert refused["ok"] is False and refused["error"]["field"] == "openai.action.user"
    assert json.loads(checked_item(refused["result"]["item"])["output"])["error"]["code"] == "invalid_field"


def test_a_computer_call_acknowledges_its_checks_and_a_failed_one_still_has_the_screen(client: SandboxClient) -> None:
    item = ResponseComputerToolCall.model_validate(
        {
            "id": "cu_1",
            "call_id": "call_c",
            "type": "computer_call",
            "status": "completed",
            "pending_safety_checks": [{"id": "sc_1", "code": "malicious_instructions", "message": "check"}],
            "actions": [{"type": "move", "x": 10, "y": 10}, {"type": "wait", "ms": 10}],
        }
    ).model_dump()
    reply = client.request({"openai": item, "acknowledge_safety_checks": True})
    assert reply["ok"], reply
    output = checked_item(reply["result"]["item"])
    assert output["acknowledged_safety_checks"] == [
        {"id": "sc_1", "code": "malicious_instructions", "message": "check"}
    ]
    assert output["output"]["image_url"].startswith("data:image/png;base64,")
    failed = client.request({"openai": {**item, "actions": [{"type": "click", "button": "left", "x": 99999, "y": 1}]}})
    assert failed["ok"] is False and failed["error"]["code"] == "out_of_bounds"
    assert checked_item(failed["result"]["item"])["output"]["type"] == "computer_screenshot"
