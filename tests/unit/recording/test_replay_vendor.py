"""Vendor calls in a recording: what is kept (a local_shell_call's env hidden like an exec's), and how a
replay resends them verbatim and judges them by their result (a shell_call's outcomes)."""

from __future__ import annotations

import json
from typing import Any

from corral.recording.bundle import Bundle
from corral.recording.judge import is_vendor_reply, judged_by_result, without_hidden
from corral.recording.redact import redact
from corral.recording.replay import FRAME_REQUEST, ReplayOptions, replay

SHELL_CALL = {"type": "shell_call", "call_id": "call_1", "action": {"commands": ["make", "make test"]}}


def shell_output(*codes: int | None) -> dict[str, Any]:
    entries = [
        {
            "stdout": "",
            "stderr": "",
            "outcome": {"type": "exit", "exit_code": c} if c is not None else {"type": "timeout"},
        }
        for c in codes
    ]
    return {"item": {"type": "shell_call_output", "call_id": "call_1", "output": entries}}


def vendor_event(
    seq: int, request: dict[str, Any], native: list[dict[str, Any]], result: dict[str, Any], ok: bool = True
) -> dict[str, Any]:
    dialect = "openai" if "openai" in request else "anthropic"
    reply: dict[str, Any] = {"ok": ok, "id": seq, "result": result}
    event = {
        "seq": seq,
        "event": "action",
        "dialect": dialect,
        "request": {"id": seq, **request},
        "native": native,
        "ok": ok,
        "reply": reply,
        "frame": None,
    }
    if not ok:
        event["error"] = reply["error"] = {"code": "timeout", "message": "slow"}
    return redact(event)


def bundle(events: list[dict[str, Any]]) -> Bundle:
    return Bundle("test", {"viewport": {"width": 64, "height": 40}}, events, {})


class Sandbox:
    """Answers each request with the next reply; keeps what it was sent (never a screenshot)."""

    def __init__(self, replies: list[dict[str, Any]]) -> None:
        self.replies, self.sent = list(replies), []  # type: list[dict[str, Any]], list[dict[str, Any]]

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        assert request is not FRAME_REQUEST, "a vendor tool's step is judged by its result"
        self.sent.append(request)
        return self.replies.pop(0)


EXECS = [
    {"type": "exec", "command": "make", "timeout_ms": 120000},
    {"type": "exec", "command": "make test", "timeout_ms": 120000},
]


def test_a_shell_call_is_resent_verbatim_and_judged_by_its_outcomes() -> None:
    recorded = bundle([vendor_event(1, {"openai": SHELL_CALL}, EXECS, shell_output(0, 2))])
    same = Sandbox([{"ok": True, "result": shell_output(0, 2)}])
    step = replay(recorded, same, ReplayOptions()).steps[0]
    assert same.sent == [{"id": 1, "openai": SHELL_CALL}]
    assert (step.status, step.judged_on, step.reason) == (
        "passed",
        "result",
        "outcome matches: exit 0, exit 2, recorded exit 0, exit 2",
    )
    other = replay(recorded, Sandbox([{"ok": True, "result": shell_output(0, 0)}]), ReplayOptions()).steps[0]
    assert (other.status, other.reason) == ("diverged", "outcome differs: exit 0, exit 0, recorded exit 0, exit 2")


def test_a_shell_call_that_timed_out_again_passes() -> None:
    recorded = bundle([vendor_event(1, {"openai": SHELL_CALL}, EXECS, shell_output(0, None), ok=False)])
    again = {"ok": False, "error": {"code": "timeout", "message": "slow"}, "result": shell_output(0, None)}
    step = replay(recorded, Sandbox([again]), ReplayOptions()).steps[0]
    assert (step.status, step.reason) == ("passed", "failed again with timeout, as recorded")


def test_an_anthropic_tool_is_judged_by_its_result_not_the_screen() -> None:
    block = {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}}
    tool_result = {
        "tool_result": {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "a"}]}
    }
    event = vendor_event(1, {"anthropic": block}, [{"type": "shell", "command": "ls"}], tool_result)
    assert judged_by_result(event) and is_vendor_reply(event["reply"])
    step = replay(bundle([event]), Sandbox([{"ok": True, "result": tool_result}]), ReplayOptions()).steps[0]
    assert (step.status, step.judged_on, step.reason) == (
        "passed",
        "result",
        "shell succeeded again (judged by its result, not the screen)",
    )


def test_the_tools_over_commands_and_files_are_judged_by_their_result() -> None:
    for kind in ("shell", "edit", "apply_patch", "file_glob", "file_grep"):
        assert judged_by_result({"request": {"action": {"type": kind}}, "native": [{"type": kind}]})


def test_a_local_shell_calls_env_is_hidden_and_replayed_without_it() -> None:
    item = {
        "type": "local_shell_call",
        "call_id": "call_l",
        "action": {"type": "exec", "command": ["deploy"], "env": {"API_TOKEN": "s3cr3t"}},
    }
    native = [{"type": "exec", "argv": ["deploy"], "env": {"API_TOKEN": "s3cr3t"}}]
    output = {"output": "", "metadata": {"exit_code": 0, "duration_seconds": 0.1}}
    result = {"item": {"type": "local_shell_call_output", "id": "call_l", "output": json.dumps(output)}}
    event = vendor_event(1, {"openai": item}, native, result)
    assert "s3cr3t" not in json.dumps(event)
    assert set(event["request"]["openai"]["action"]["env"]["API_TOKEN"]) == {"size", "sha256"}
    request, hidden = without_hidden(event["request"])
    assert hidden == ("env.API_TOKEN",)
    assert request["openai"]["action"] == {"type": "exec", "command": ["deploy"], "env": {}}
    sandbox = Sandbox([{"ok": True, "result": result}])
    step = replay(bundle([event]), sandbox, ReplayOptions()).steps[0]
    assert sandbox.sent == [request]
    assert step.status == "passed" and step.reason.startswith(
        "outcome matches: exit 0, recorded exit 0; sent without env.API_TOKEN"
    )
