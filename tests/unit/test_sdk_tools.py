"""The SDK's vendor tool calls at the transport seam: ``sb.anthropic``, ``sb.openai`` and
``sb.tool_results`` send each call whole and give back the vendor's own result (a failure's error
form too), alike in both twins, from dicts and from the vendors' own SDK objects."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from anthropic.types.beta import BetaMessage, BetaToolUseBlock
from openai.types.responses import Response, ResponseFunctionShellToolCall
from websockets.exceptions import ConnectionClosed

from corral.errors import ActionFailed, CorralError
from corral.sdk import AsyncSandbox, Sandbox

Answer = Callable[[dict[str, Any]], dict[str, Any]]


class Wire:
    """The transport seam: keeps what a twin sent, answers by a function of the message."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.sent: list[dict[str, Any]] = []

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        json.dumps(message)  # what goes on the wire is JSON: SDK objects were dumped
        self.sent.append(message)
        return self.answer(message)


class AsyncWire(Wire):
    async def request(self, message: dict[str, Any]) -> dict[str, Any]:  # type: ignore[override]
        return super().request(message)


def _twins(answer: Answer) -> tuple[Sandbox, Wire, AsyncSandbox, Wire]:
    sandbox, twin = Sandbox.__new__(Sandbox), AsyncSandbox.__new__(AsyncSandbox)
    sandbox.id = twin.id = "ses_1"
    ws, twin_ws = Wire(answer), AsyncWire(answer)
    sandbox._ws, twin._ws = ws, twin_ws  # type: ignore[assignment]
    return sandbox, ws, twin, twin_ws


# -- what the sandbox answers, as docs/protocol.md "Vendor tools" says ------------------------------------


def _tool_result(block: dict[str, Any], text: str, is_error: bool = False) -> dict[str, Any]:
    result: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": block["id"],
        "content": [{"type": "text", "text": text}],
    }
    if is_error:
        result["is_error"] = True
    if "toolset_name" in block:
        result["toolset_name"] = block["toolset_name"]
    return result


def _item(call: dict[str, Any]) -> dict[str, Any]:
    kind = call["type"]
    if kind == "computer_call":
        shot = {"type": "computer_screenshot", "image_url": "data:image/png;base64,iVBORw=="}
        return {"type": "computer_call_output", "call_id": call["call_id"], "output": shot}
    if kind == "shell_call":
        entry = {"stdout": "hi\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}
        return {"type": "shell_call_output", "call_id": call["call_id"], "output": [entry]}
    if kind == "local_shell_call":
        return {"type": "local_shell_call_output", "id": call["call_id"], "output": '{"output": "hi\\n"}'}
    return {"type": "apply_patch_call_output", "call_id": call["call_id"], "status": "completed", "output": "Done"}


def answered(message: dict[str, Any]) -> dict[str, Any]:
    """A success for every vendor call."""
    if "anthropic" in message:
        block = message["anthropic"]
        return {"ok": True, "id": 1, "result": {"tool_result": _tool_result(block, f"ran {block['name']}")}}
    return {"ok": True, "id": 1, "result": {"item": _item(message["openai"])}}


NO_MATCH = {"code": "no_match", "message": "No replacement was performed.", "field": "anthropic.input.old_str"}


def failing_edits(message: dict[str, Any]) -> dict[str, Any]:
    """The editor's calls fail with their vendor error form; the rest succeed."""
    block = message.get("anthropic") or {}
    if block.get("name") == "str_replace_based_edit_tool":
        result = {"tool_result": _tool_result(block, NO_MATCH["message"], is_error=True)}
        return {"ok": False, "id": 1, "error": NO_MATCH, "result": result}
    return answered(message)


BASH = {"type": "tool_use", "id": "toolu_01", "name": "bash", "input": {"command": "echo hi"}}
CLICK = {
    "type": "tool_use",
    "id": "toolu_02",
    "name": "left_click",
    "input": {"coordinate": [10, 20]},
    "toolset_name": "computer",
}
EDIT = {
    "type": "tool_use",
    "id": "toolu_03",
    "name": "str_replace_based_edit_tool",
    "input": {"command": "str_replace", "path": "/workspace/a.txt", "old_str": "x", "new_str": "y"},
}
SHELL = {
    "type": "shell_call",
    "id": "sh_1",
    "call_id": "call_1",
    "status": "completed",
    "action": {"commands": ["echo hi"], "timeout_ms": 5000, "max_output_length": 1000},
}
COMPUTER = {
    "type": "computer_call",
    "id": "cu_1",
    "call_id": "call_2",
    "status": "completed",
    "action": {"type": "click", "button": "left", "x": 10, "y": 20},
    "pending_safety_checks": [{"id": "sc_1", "code": "malicious_instructions", "message": "check the page"}],
}
LOCAL_SHELL = {
    "type": "local_shell_call",
    "id": "ls_1",
    "call_id": "call_3",
    "status": "completed",
    "action": {"type": "exec", "command": ["echo", "hi"], "env": {}},
}
PATCH = {
    "type": "apply_patch_call",
    "id": "ap_1",
    "call_id": "call_4",
    "status": "completed",
    "operation": {"type": "create_file", "path": "/workspace/b.txt", "diff": "+hello\n"},
}


# -- one call ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "message", "value"),
    [
        (
            lambda s: s.anthropic(BASH),
            {"anthropic": BASH},
            _tool_result(BASH, "ran bash"),
        ),
        (
            lambda s: s.anthropic(CLICK, display=(1024, 640), screenshot={"format": "jpeg"}),
            {"anthropic": CLICK, "display": {"width": 1024, "height": 640}, "screenshot": {"format": "jpeg"}},
            _tool_result(CLICK, "ran left_click"),
        ),
        (
            lambda s: s.anthropic(BetaToolUseBlock.model_validate(CLICK)),
            {"anthropic": CLICK},
            _tool_result(CLICK, "ran left_click"),
        ),
        (lambda s: s.openai(SHELL), {"openai": SHELL}, _item(SHELL)),
        (
            lambda s: s.openai(COMPUTER, acknowledge_safety_checks=True),
            {"openai": COMPUTER, "acknowledge_safety_checks": True},
            _item(COMPUTER),
        ),
        (
            lambda s: s.openai(ResponseFunctionShellToolCall.model_validate(SHELL), timeout_ms=9000),
            {"openai": SHELL, "timeout_ms": 9000},
            _item(SHELL),
        ),
        (lambda s: s.openai(LOCAL_SHELL), {"openai": LOCAL_SHELL}, _item(LOCAL_SHELL)),
        (lambda s: s.openai(PATCH), {"openai": PATCH}, _item(PATCH)),
    ],
)
async def test_a_vendor_call_goes_whole_and_its_result_comes_back_in_both_twins(
    call: Callable[[Any], Any], message: dict[str, Any], value: dict[str, Any]
) -> None:
    sandbox, ws, twin, twin_ws = _twins(answered)
    assert call(sandbox) == await call(twin) == value
    assert ws.sent == twin_ws.sent == [message]


async def test_a_failed_call_returns_its_error_form_and_tells_on_error_in_both_twins() -> None:
    sandbox, _, twin, _ = _twins(failing_edits)
    heard: list[ActionFailed] = []
    expected = _tool_result(EDIT, NO_MATCH["message"], is_error=True)
    assert sandbox.anthropic(EDIT, on_error=heard.append) == expected
    assert await twin.anthropic(EDIT, on_error=heard.append) == expected
    assert sandbox.anthropic(EDIT) == await twin.anthropic(EDIT) == expected  # no hook: nothing raised either
    assert [(e.code, e.field, e.error) for e in heard] == [("no_match", "anthropic.input.old_str", NO_MATCH)] * 2


async def test_a_failed_apply_patch_comes_back_as_its_failed_output() -> None:
    failed = {"type": "apply_patch_call_output", "call_id": "call_4", "status": "failed", "output": "file exists"}
    error = {"code": "file_exists", "message": "/workspace/b.txt exists"}
    sandbox, _, twin, _ = _twins(lambda _: {"ok": False, "id": 1, "error": error, "result": {"item": failed}})
    heard: list[ActionFailed] = []
    assert sandbox.openai(PATCH, on_error=heard.append) == await twin.openai(PATCH, on_error=heard.append) == failed
    assert [e.code for e in heard] == ["file_exists", "file_exists"]


@pytest.mark.parametrize("method", ["anthropic", "openai"])
async def test_a_failure_with_no_vendor_result_raises_action_failed_in_both_twins(method: str) -> None:
    error = {"code": "invalid_request", "message": "a tool_use block needs a string id", "field": "anthropic.id"}
    sandbox, _, twin, _ = _twins(lambda _: {"ok": False, "id": 1, "error": error})
    call = {"anthropic": {"type": "tool_use", "name": "bash", "input": {}}, "openai": {**SHELL, "call_id": 5}}[method]
    with pytest.raises(ActionFailed) as sync_failure:
        getattr(sandbox, method)(call)
    with pytest.raises(ActionFailed) as async_failure:
        await getattr(twin, method)(call)
    assert sync_failure.value.error == async_failure.value.error == error


@pytest.mark.parametrize(
    ("method", "given", "reason"),
    [
        ("anthropic", {"action": "left_click", "coordinate": [1, 2]}, "run_anthropic"),
        ("openai", {"type": "click", "x": 1, "y": 2}, "run_openai"),
        ("openai", {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}, "one of"),
        ("anthropic", "bash", "must be a dict"),
    ],
)
async def test_what_is_no_vendor_call_is_refused_before_anything_is_sent(method: str, given: Any, reason: str) -> None:
    sandbox, ws, twin, twin_ws = _twins(answered)
    with pytest.raises(CorralError, match=reason):
        getattr(sandbox, method)(given)
    with pytest.raises(CorralError, match=reason):
        await getattr(twin, method)(given)
    assert ws.sent == twin_ws.sent == []


async def test_a_success_without_the_vendor_result_is_no_silent_empty_result() -> None:
    sandbox, _, twin, _ = _twins(lambda _: {"ok": True, "id": 1, "result": {"tool_result_content": []}})
    with pytest.raises(CorralError, match=r"no result\.tool_result"):
        sandbox.anthropic(BASH)
    with pytest.raises(CorralError, match=r"no result\.item"):
        await twin.openai(SHELL)


async def test_a_lost_connection_is_raised_not_turned_into_a_result() -> None:
    def lost(_: dict[str, Any]) -> dict[str, Any]:
        raise ConnectionClosed(None, None)

    sandbox, _, twin, _ = _twins(lost)
    with pytest.raises(ConnectionClosed):
        sandbox.tool_results([BASH])
    with pytest.raises(ConnectionClosed):
        await twin.anthropic(BASH)


# -- a whole reply ----------------------------------------------------------------------------------------

USAGE = {"input_tokens": 10, "output_tokens": 20}
MESSAGE = {
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-6",
    "stop_reason": "tool_use",
    "usage": USAGE,
    "content": [
        {"type": "text", "text": "Let me look."},
        BASH,
        {"type": "thinking", "thinking": "then click", "signature": "sig"},
        CLICK,
        EDIT,
    ],
}
RESPONSE = {
    "id": "resp_01",
    "object": "response",
    "created_at": 1764770000,
    "model": "gpt-5.5",
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [{"type": "computer"}, {"type": "shell", "environment": {"type": "local"}}, {"type": "apply_patch"}],
    "output": [
        {"type": "reasoning", "id": "rs_1", "summary": []},
        SHELL,
        COMPUTER,
        {"type": "function_call", "id": "fc_1", "call_id": "call_9", "name": "lookup", "arguments": "{}"},
        LOCAL_SHELL,
        PATCH,
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "done", "annotations": []}],
        },
    ],
}


@pytest.mark.parametrize(
    "reply",
    [BetaMessage.model_validate(MESSAGE), MESSAGE, MESSAGE["content"]],
    ids=["BetaMessage", "dict", "content"],
)
async def test_tool_results_answers_every_tool_use_of_a_messages_reply_in_order(reply: Any) -> None:
    sandbox, ws, twin, twin_ws = _twins(failing_edits)
    heard: list[ActionFailed] = []
    results = sandbox.tool_results(reply, display=(1024, 640), on_error=heard.append)
    assert results == await twin.tool_results(reply, display=(1024, 640), on_error=heard.append)
    assert [r["tool_use_id"] for r in results] == ["toolu_01", "toolu_02", "toolu_03"]
    assert results[2]["is_error"] is True and results[1]["toolset_name"] == "computer"
    display = {"width": 1024, "height": 640}
    assert ws.sent == twin_ws.sent == [{"anthropic": block, "display": display} for block in (BASH, CLICK, EDIT)]
    assert [e.code for e in heard] == ["no_match", "no_match"]  # the one failure, once per twin


@pytest.mark.parametrize(
    "reply", [Response.model_validate(RESPONSE), RESPONSE, RESPONSE["output"]], ids=["Response", "dict", "output"]
)
async def test_tool_results_answers_every_served_item_of_a_responses_reply_in_order(reply: Any) -> None:
    sandbox, ws, twin, twin_ws = _twins(answered)
    results = sandbox.tool_results(reply, acknowledge_safety_checks=True)
    assert results == await twin.tool_results(reply, acknowledge_safety_checks=True)
    assert [r["type"] for r in results] == [
        "shell_call_output",
        "computer_call_output",
        "local_shell_call_output",
        "apply_patch_call_output",
    ]
    assert [r.get("call_id", r.get("id")) for r in results] == ["call_1", "call_2", "call_3", "call_4"]
    sent = [{"openai": item, "acknowledge_safety_checks": True} for item in (SHELL, COMPUTER, LOCAL_SHELL, PATCH)]
    assert ws.sent == twin_ws.sent == sent


async def test_a_reply_with_no_tool_call_sends_nothing() -> None:
    sandbox, ws, twin, twin_ws = _twins(answered)
    text_only = {**MESSAGE, "content": [{"type": "text", "text": "All done."}], "stop_reason": "end_turn"}
    assert sandbox.tool_results(BetaMessage.model_validate(text_only)) == await twin.tool_results(text_only) == []
    assert ws.sent == twin_ws.sent == []
