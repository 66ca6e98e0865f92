"""Whole replies for vendor calls (corral.protocol.reply over corral.protocol.vendor.replies): first key
``ok``, the vendor's result beside Corral's error, and today's dialect replies unchanged."""

from __future__ import annotations

import json

from corral.errors import ActionError, ErrorCode
from corral.protocol import EncodedImage, reply
from corral.protocol.vendor import call_of

from ..conftest import PlanFn
from ..wired import result_of
from .sdk import checked_item, checked_tool_result

PNG = EncodedImage("image/png", b"\x89PNG-fake", 1280, 800)
BASH = {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}}
SHELL = {"type": "shell_call", "call_id": "call_1", "action": {"commands": ["a", "b"], "timeout_ms": 100}}


def test_a_vendor_success(plan: PlanFn) -> None:
    p = plan({"id": 3, "anthropic": BASH})
    out = reply.success(p, [result_of({"output": "x", "exit_code": 0})], None, 2.5)
    assert list(out) == ["ok", "id", "result", "elapsed_ms"]
    assert out["ok"] is True and out["id"] == 3 and list(out["result"]) == ["tool_result"]
    checked_tool_result(out["result"]["tool_result"])
    assert json.loads(reply.encode(out)) == out


def test_a_vendor_success_with_its_screenshot_keeps_the_image_metadata_only(plan: PlanFn) -> None:
    p = plan({"id": 3, "anthropic": {**BASH, "name": "computer", "input": {"action": "screenshot"}}})
    out = reply.success(p, [result_of({}, PNG)], PNG, 1.0)
    assert out["screenshot"] == {"media_type": "image/png", "width": 1280, "height": 800}
    assert checked_tool_result(out["result"]["tool_result"])["content"][0]["type"] == "image"


def test_a_shell_call_that_timed_out_is_a_failure_with_its_item(plan: PlanFn) -> None:
    p = plan({"id": "s", "openai": SHELL})
    ran = [result_of({"stdout": "", "stderr": "", "exit_code": None, "signal": "SIGKILL", "timed_out": True})]
    out = reply.success(p, ran, None, 100.0)
    assert list(out)[:4] == ["ok", "id", "error", "result"]
    assert out["ok"] is False and out["error"]["code"] == "timeout"
    item = checked_item(out["result"]["item"])
    assert [entry["outcome"] for entry in item["output"]] == [{"type": "timeout"}, {"type": "timeout"}]
    assert reply.failed(reply.encode(out)) and reply.error_code(reply.encode(out)) == "timeout"


def test_a_vendor_failure_carries_both_forms() -> None:
    call = call_of({"anthropic": BASH})
    error = ActionError(ErrorCode.NO_SUCH_FILE, "no such file: /x", "anthropic.input.path")
    out = reply.failure(7, error, call)
    assert out == {
        "ok": False,
        "id": 7,
        "error": {"code": "no_such_file", "message": "no such file: /x", "field": "anthropic.input.path"},
        "result": {
            "tool_result": {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": [{"type": "text", "text": "no such file: /x"}],
                "is_error": True,
            }
        },
    }
    checked_tool_result(out["result"]["tool_result"])


def test_a_failure_without_a_vendor_form_is_as_today() -> None:
    error = ActionError(ErrorCode.TIMEOUT, "slow")
    computer = call_of({"openai": {"type": "computer_call", "call_id": "c", "action": {"type": "wait"}}})
    assert reply.failure(1, error, computer) == {"ok": False, "id": 1, "error": {"code": "timeout", "message": "slow"}}
    assert reply.failure(1, error) == {"ok": False, "id": 1, "error": {"code": "timeout", "message": "slow"}}


def test_todays_dialect_replies_are_unchanged(plan: PlanFn) -> None:
    bare = plan({"id": 1, "anthropic": {"action": "screenshot"}})
    assert list(reply.success(bare, [result_of({}, PNG)], PNG, 1.0)["result"]) == ["tool_result_content"]
    action = plan({"id": 1, "openai": {"type": "screenshot"}})
    assert list(reply.success(action, [result_of({}, PNG)], PNG, 1.0)["result"]) == ["output"]
