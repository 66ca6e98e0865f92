"""The dispatcher's vendor calls over a stand-in desktop: the vendor's own form on success and on every
failure path (planning included), a shell_call's shared budget, and what the recording keeps."""

from __future__ import annotations

import base64
import json
from typing import Any

from corral.errors import ActionError, ErrorCode
from corral.protocol import Limits
from corral.protocol import results as r
from corral.sandbox.dispatch import Dispatcher

from .desktop_fake import IMAGE, Parts, fake_desktop
from .test_dispatch import Recorder, Reporter

IMAGE_URL = "data:image/png;base64," + base64.b64encode(IMAGE.data).decode()


class ScriptedProcesses:
    """Answers each exec with the next scripted result; keeps the actions it was given."""

    def __init__(self, results: list[r.ExecResult | ActionError]) -> None:
        self.results = results
        self.actions: list[Any] = []

    async def run(self, action: Any, context: Any) -> r.ExecResult:
        self.actions.append(action)
        result = self.results[len(self.actions) - 1]
        if isinstance(result, ActionError):
            raise result
        return result

    async def close(self) -> None:
        return None


def _dispatcher(processes: ScriptedProcesses | None = None) -> tuple[Dispatcher, Recorder]:
    desktop = fake_desktop(Parts())
    if processes is not None:
        desktop.processes = processes  # type: ignore[assignment]
    recorder = Recorder()
    return Dispatcher(desktop, Limits(), Reporter(), recorder), recorder  # type: ignore[arg-type]


def _exec(stdout: str = "", exit_code: int | None = 0, timed_out: bool = False) -> r.ExecResult:
    signal = "SIGKILL" if timed_out else None
    ended = {"pid": 5, "exit_code": exit_code, "signal": signal, "oom_killed": None, "duration_ms": 1.0}
    streams = {"stdout": stdout, "stdout_truncated": False, "stderr": "", "stderr_truncated": False}
    return r.ExecResult(r.ExecFinished(**ended, **streams, timed_out=timed_out, encoding="utf-8"))


async def test_an_unknown_tool_answers_with_an_is_error_tool_result() -> None:
    dispatcher, recorder = _dispatcher()
    block = {"type": "tool_use", "id": "toolu_9", "name": "web_fetch", "input": {}}
    reply = await dispatcher.handle(json.dumps({"id": 1, "anthropic": block}))
    assert reply["ok"] is False and reply["error"]["code"] == "unknown_tool"
    assert reply["result"] == {
        "tool_result": {
            "type": "tool_result",
            "tool_use_id": "toolu_9",
            "content": [{"type": "text", "text": reply["error"]["message"]}],
            "is_error": True,
        }
    }
    assert recorder.events[0]["reply"] == reply


async def test_a_bad_member_input_answers_in_the_vendor_form_with_the_toolset() -> None:
    dispatcher, _ = _dispatcher()
    block = {"type": "tool_use", "id": "t", "name": "scroll", "input": {}, "toolset_name": "computer"}
    reply = await dispatcher.handle(json.dumps({"id": 2, "anthropic": block}))
    assert reply["ok"] is False and reply["error"]["code"] == "missing_field"
    assert reply["result"]["tool_result"]["toolset_name"] == "computer"
    assert reply["result"]["tool_result"]["is_error"] is True


async def test_without_a_readable_call_id_only_the_error() -> None:
    dispatcher, _ = _dispatcher()
    reply = await dispatcher.handle(
        json.dumps({"id": 3, "anthropic": {"type": "tool_use", "name": "bash", "input": {}}})
    )
    assert reply == {"ok": False, "id": 3, "error": reply["error"]} and reply["error"]["field"] == "anthropic.id"


async def test_a_failed_computer_call_answers_with_the_current_screen() -> None:
    dispatcher, _ = _dispatcher()
    item = {"type": "computer_call", "call_id": "call_1", "action": {"type": "click", "x": 99999, "y": 1}}
    reply = await dispatcher.handle(json.dumps({"id": 4, "openai": item}))
    assert reply["ok"] is False and reply["error"]["code"] == "out_of_bounds"
    assert reply["result"] == {
        "item": {
            "type": "computer_call_output",
            "call_id": "call_1",
            "output": {"type": "computer_screenshot", "image_url": IMAGE_URL},
        }
    }


async def test_a_computer_call_succeeds_with_its_screenshot_and_acknowledgement() -> None:
    dispatcher, recorder = _dispatcher()
    item = {
        "type": "computer_call",
        "call_id": "call_2",
        "action": {"type": "click", "x": 5, "y": 5},
        "pending_safety_checks": [{"id": "sc", "code": "irrelevant_domain", "message": "m"}],
    }
    message = {"id": 5, "openai": item, "acknowledge_safety_checks": True, "wait_for": "none"}
    reply = await dispatcher.handle(json.dumps(message))
    assert reply["ok"] is True
    assert reply["result"]["item"]["output"]["image_url"] == IMAGE_URL
    assert reply["result"]["item"]["acknowledged_safety_checks"] == [
        {"id": "sc", "code": "irrelevant_domain", "message": "m"}
    ]
    event = recorder.events[0]
    assert event["dialect"] == "openai" and [step["type"] for step in event["native"]] == ["click"]


async def test_a_shell_call_stops_at_the_command_that_timed_out() -> None:
    processes = ScriptedProcesses([_exec("one\n"), _exec("two", exit_code=None, timed_out=True), _exec("never")])
    dispatcher, recorder = _dispatcher(processes)
    item = {"type": "shell_call", "call_id": "call_3", "action": {"commands": ["a", "b", "c"], "timeout_ms": 60_000}}
    reply = await dispatcher.handle(json.dumps({"id": 6, "openai": item}))
    assert [action.command for action in processes.actions] == ["a", "b"]  # "c" never ran
    assert processes.actions[0].timeout_ms == 60_000
    assert 0 < processes.actions[1].timeout_ms <= 60_000  # what was left of the shared budget
    assert list(reply)[:4] == ["ok", "id", "error", "result"]
    assert reply["ok"] is False and reply["error"]["code"] == "timeout"
    assert reply["result"]["item"]["output"] == [
        {"stdout": "one\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}},
        {"stdout": "two", "stderr": "", "outcome": {"type": "timeout"}},
        {"stdout": "", "stderr": "", "outcome": {"type": "timeout"}},
    ]
    assert "action_id" in reply
    event = recorder.events[0]
    assert event["dialect"] == "openai" and event["ok"] is False
    assert [step["command"] for step in event["native"]] == ["a", "b", "c"]


async def test_a_shell_call_command_that_cannot_run_is_its_own_entry() -> None:
    # The "one entry per command": the others still run and keep their output.
    refused = ActionError(ErrorCode.PROCESS_LIMIT, "the session runs its most processes", field="action.command")
    processes = ScriptedProcesses([_exec("one\n"), refused, _exec("three\n")])
    dispatcher, _ = _dispatcher(processes)
    item = {"type": "shell_call", "call_id": "call_5", "action": {"commands": ["a", "b", "c"]}}
    reply = await dispatcher.handle(json.dumps({"id": 8, "openai": item}))
    assert [action.command for action in processes.actions] == ["a", "b", "c"]
    assert reply["ok"] is False and reply["error"]["code"] == "process_limit"
    assert reply["error"]["field"] == "openai.action.commands[1]"
    assert reply["result"]["item"]["output"] == [
        {"stdout": "one\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}},
        {"stdout": "", "stderr": "the session runs its most processes", "outcome": {"type": "exit", "exit_code": 1}},
        {"stdout": "three\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}},
    ]


async def test_a_shell_call_whose_commands_exit_non_zero_is_ok() -> None:
    processes = ScriptedProcesses([_exec("", exit_code=2)])
    dispatcher, _ = _dispatcher(processes)
    item = {"type": "shell_call", "call_id": "call_4", "action": {"commands": ["false"]}}
    reply = await dispatcher.handle(json.dumps({"id": 7, "openai": item}))
    assert reply["ok"] is True
    assert reply["result"]["item"]["output"][0]["outcome"] == {"type": "exit", "exit_code": 2}


async def test_an_anthropic_write_is_recorded_with_its_dialect_and_native_steps() -> None:
    dispatcher, recorder = _dispatcher()
    block = {"type": "tool_use", "id": "toolu_w", "name": "write", "input": {"file_path": "x", "content": "hi"}}
    reply = await dispatcher.handle(json.dumps({"id": 8, "anthropic": block}))
    assert reply["ok"] is True
    assert reply["result"] == {
        "tool_result": {
            "type": "tool_result",
            "tool_use_id": "toolu_w",
            "content": [{"type": "text", "text": "Wrote 0 bytes to /workspace/x"}],
        }
    }
    event = recorder.events[0]
    assert event["dialect"] == "anthropic" and event["request"]["anthropic"] == block
    (native,) = event["native"]
    assert native["type"] == "file_write" and native["path"] == "/workspace/x" and native["make_dirs"] is True
    assert event["action_id"] == reply["action_id"]


async def test_an_internal_error_in_a_vendor_call_still_answers_in_its_form() -> None:
    class Broken(ScriptedProcesses):
        async def run(self, action: Any, context: Any) -> r.ExecResult:
            raise RuntimeError("boom")

    dispatcher, _ = _dispatcher(Broken([]))
    item = {"type": "local_shell_call", "call_id": "call_5", "action": {"type": "exec", "command": ["id"], "env": {}}}
    reply = await dispatcher.handle(json.dumps({"id": 9, "openai": item}))
    assert reply["ok"] is False and reply["error"]["code"] == "internal"
    output = json.loads(reply["result"]["item"]["output"])
    assert output == {"output": "", "error": reply["error"]}


async def test_a_refused_exec_names_the_shell_calls_own_field() -> None:
    class Capped(ScriptedProcesses):  # a controller configured with a lower cap than the translator's
        async def run(self, action: Any, context: Any) -> r.ExecResult:
            raise ActionError(ErrorCode.INVALID_FIELD, "max_output_bytes is at most 1024", "action.max_output_bytes")

    dispatcher, _ = _dispatcher(Capped([]))
    item = {"type": "shell_call", "call_id": "call_6", "action": {"commands": ["yes"], "max_output_length": 4096}}
    reply = await dispatcher.handle(json.dumps({"id": 10, "openai": item}))
    assert reply["ok"] is False
    assert reply["error"]["field"] == "openai.action.max_output_length"
