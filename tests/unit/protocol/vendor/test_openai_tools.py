"""OpenAI output items to native steps, and the input items that answer them (checked against the
``openai`` SDK's ``ResponseInputItemParam`` members)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import ResponseApplyPatchToolCall, ResponseComputerToolCall, ResponseFunctionShellToolCall
from openai.types.responses.response_output_item import LocalShellCall

from corral.errors import ActionError, ErrorCode
from corral.protocol import ActionResult, EncodedImage, Plan, vendor
from corral.protocol import actions as a
from corral.protocol.vendor import call_of, failure_result, openai_tools, success_result

from ..conftest import FailFn, PlanFn
from ..wired import result_of
from .sdk import checked_item

PNG = EncodedImage("image/png", b"\x89PNG-fake", 1280, 800)
DATA_URL = "data:image/png;base64,iVBORy1mYWtl"


def computer_call(checks: list[dict[str, Any]] | None = None, **actions: Any) -> dict[str, Any]:
    item = {"id": "cu_1", "call_id": "call_c", "type": "computer_call", "status": "completed"}
    return ResponseComputerToolCall.model_validate(
        {**item, "pending_safety_checks": checks or [], **actions}
    ).model_dump()


def shell_call(commands: list[str], **limits: Any) -> dict[str, Any]:
    action = {"commands": commands, **limits}
    item = {"id": "sh_1", "call_id": "call_s", "type": "shell_call", "status": "completed", "action": action}
    return ResponseFunctionShellToolCall.model_validate(item).model_dump()


def local_shell_call(command: list[str], **options: Any) -> dict[str, Any]:
    action = {"type": "exec", "command": command, "env": {}, **options}
    item = {"id": "ls_1", "call_id": "call_l", "type": "local_shell_call", "status": "completed", "action": action}
    return LocalShellCall.model_validate(item).model_dump()


def apply_patch_call(operation: dict[str, Any]) -> dict[str, Any]:
    item = {
        "id": "ap_1",
        "call_id": "call_p",
        "type": "apply_patch_call",
        "status": "completed",
        "operation": operation,
    }
    return ResponseApplyPatchToolCall.model_validate(item).model_dump()


def natives(p: Plan) -> list[dict[str, Any]]:
    return [step.action.model_dump(mode="json", exclude_defaults=True) for step in p.steps]


# -- translation ---------------------------------------------------------------------------------------------------


def test_a_computer_call_with_one_action(plan: PlanFn) -> None:
    p = plan(
        {
            "id": 1,
            "openai": computer_call(action={"type": "click", "x": 5, "y": 6, "button": "right", "keys": ["CTRL"]}),
        }
    )
    assert natives(p) == [{"type": "click", "button": "right", "x": 5, "y": 6, "modifiers": ["Control_L"]}]
    assert [step.field for step in p.steps] == ["openai.action"]
    assert p.call is not None and p.call.computer and p.after.screenshot is not None


def test_a_computer_call_with_a_batch_as_the_sdk_dumps_it(plan: PlanFn) -> None:
    actions = [
        {"type": "click", "x": 5, "y": 6, "button": "left"},
        {"type": "wait"},
        {"type": "scroll", "x": 1, "y": 2, "scroll_x": 0, "scroll_y": 3},
        {"type": "drag", "path": [{"x": 1, "y": 1}, {"x": 2, "y": 2}]},
        {"type": "keypress", "keys": ["CTRL", "A"]},
        {"type": "type", "text": "hi"},
        {"type": "move", "x": 3, "y": 3},
        {"type": "double_click", "x": 3, "y": 3},
        {"type": "screenshot"},
    ]
    p = plan({"openai": computer_call(actions=actions)})
    assert [n["type"] for n in natives(p)] == [
        "click",
        "wait",
        "scroll",
        "drag",
        "key",
        "type",
        "move",
        "click",
        "screenshot",
    ]
    assert natives(p)[4] == {"type": "key", "keys": "Control_L+a"}
    assert [step.field for step in p.steps][:2] == ["openai.actions[0]", "openai.actions[1]"]
    assert p.after.screenshot is None  # the batch ends with its own screenshot


@pytest.mark.parametrize(
    ("actions", "code", "field"),
    [
        ({}, ErrorCode.MISSING_FIELD, "openai.action"),
        (
            {"action": {"type": "click", "button": "left", "x": 5000, "y": 1}},
            ErrorCode.OUT_OF_BOUNDS,
            "openai.action.x",
        ),
        (
            {"actions": [{"type": "screenshot"}, {"type": "keypress", "keys": ["NOPE"]}]},
            ErrorCode.UNKNOWN_KEY,
            "openai.actions[1].keys[0]",
        ),
    ],
)
def test_a_computer_call_with_the_wrong_action(
    fail: FailFn, actions: dict[str, Any], code: ErrorCode, field: str
) -> None:
    error = fail(
        {"openai": computer_call(**actions) if actions else {**computer_call(action={"type": "wait"}), "action": None}}
    )
    assert (error.code, error.field) == (code, field)


def test_a_shell_call_is_one_exec_per_command_sharing_the_budget(plan: PlanFn) -> None:
    p = plan({"openai": shell_call(["cd src", "ls -la"], timeout_ms=5000, max_output_length=64)})
    assert natives(p) == [
        {"type": "exec", "command": "cd src", "timeout_ms": 5000, "max_output_bytes": 256},
        {"type": "exec", "command": "ls -la", "timeout_ms": 5000, "max_output_bytes": 256},
    ]
    assert [step.field for step in p.steps] == ["openai.action.commands[0]", "openai.action.commands[1]"]
    assert p.call is not None and p.call.max_output_length == 64 and not p.call.computer
    assert p.after.screenshot is None and not p.after.wait_for_stable
    default = plan({"openai": shell_call(["true"])})
    assert natives(default) == [{"type": "exec", "command": "true", "timeout_ms": a.SHELL_TIMEOUT_MS}]


@pytest.mark.parametrize(
    ("item", "code", "field"),
    [
        (shell_call([]), ErrorCode.INVALID_FIELD, "openai.action.commands"),
        (shell_call(["ok", "a\x00b"]), ErrorCode.INVALID_FIELD, "openai.action.commands[1].command"),
        (shell_call(["ls"], timeout_ms=0), ErrorCode.INVALID_FIELD, "openai.action.timeout_ms"),
        ({"type": "shell_call", "call_id": "c"}, ErrorCode.MISSING_FIELD, "openai.action"),
        ({"type": "shell_call", "action": {"commands": ["ls"]}}, ErrorCode.MISSING_FIELD, "openai.call_id"),
    ],
)
def test_a_shell_call_with_the_wrong_input(fail: FailFn, item: dict[str, Any], code: ErrorCode, field: str) -> None:
    error = fail({"openai": item})
    assert (error.code, error.field) == (code, field)


def test_a_local_shell_call_is_an_exec_of_its_argv(plan: PlanFn) -> None:
    item = local_shell_call(["ls", "-l"], env={"A": "1"}, timeout_ms=3000, working_directory="src", user="agent")
    p = plan({"openai": item})
    assert natives(p) == [
        {"type": "exec", "argv": ["ls", "-l"], "cwd": "/workspace/src", "env": {"A": "1"}, "timeout_ms": 3000}
    ]
    bare = plan({"openai": local_shell_call(["pwd"], working_directory="/tmp")})
    assert natives(bare) == [{"type": "exec", "argv": ["pwd"], "cwd": "/tmp"}]


@pytest.mark.parametrize(
    ("item", "code", "field"),
    [
        (local_shell_call(["id"], user="root"), ErrorCode.INVALID_FIELD, "openai.action.user"),
        (local_shell_call(["id"], env={"1BAD": "x"}), ErrorCode.INVALID_FIELD, "openai.action.env"),
        (local_shell_call(["a\x00"]), ErrorCode.INVALID_FIELD, "openai.action.command[0]"),
        (
            local_shell_call(["id"], working_directory="a\x00"),
            ErrorCode.INVALID_FIELD,
            "openai.action.working_directory",
        ),
        (
            {**local_shell_call(["id"]), "action": {"type": "exec", "command": []}},
            ErrorCode.INVALID_FIELD,
            "openai.action.command",
        ),
    ],
)
def test_a_local_shell_call_with_the_wrong_input(
    fail: FailFn, item: dict[str, Any], code: ErrorCode, field: str
) -> None:
    error = fail({"openai": item})
    assert (error.code, error.field) == (code, field)


@pytest.mark.parametrize(
    ("operation", "native"),
    [
        (
            {"type": "create_file", "path": "hello.txt", "diff": "+hi\n"},
            {"type": "apply_patch", "operation": "create_file", "path": "hello.txt", "diff": "+hi\n"},
        ),
        (
            {"type": "update_file", "path": "/workspace/a.py", "diff": "@@\n-x\n+y\n"},
            {"type": "apply_patch", "operation": "update_file", "path": "/workspace/a.py", "diff": "@@\n-x\n+y\n"},
        ),
        (
            {"type": "delete_file", "path": "old.txt"},
            {"type": "apply_patch", "operation": "delete_file", "path": "old.txt"},
        ),
    ],
)
def test_an_apply_patch_call(plan: PlanFn, operation: dict[str, Any], native: dict[str, Any]) -> None:
    p = plan({"openai": apply_patch_call(operation)})
    assert natives(p) == [native]
    assert p.call is not None and p.after.screenshot is None


@pytest.mark.parametrize(
    ("operation", "code", "field"),
    [
        ({"type": "update_file", "path": "a"}, ErrorCode.MISSING_FIELD, "openai.operation.diff"),
        ({"type": "rename_file", "path": "a"}, ErrorCode.INVALID_FIELD, "openai.operation.type"),
        ({"type": "delete_file", "path": ""}, ErrorCode.INVALID_FIELD, "openai.operation.path"),
    ],
)
def test_an_apply_patch_call_with_the_wrong_input(
    fail: FailFn, operation: dict[str, Any], code: ErrorCode, field: str
) -> None:
    item = {"type": "apply_patch_call", "call_id": "call_p", "operation": operation}
    error = fail({"openai": item})
    assert (error.code, error.field) == (code, field)


def test_todays_forms_are_unchanged(plan: PlanFn, fail: FailFn) -> None:
    assert plan({"openai": {"type": "click", "x": 1, "y": 2}}).call is None
    assert plan({"openai": [{"type": "screenshot"}]}).call is None
    assert fail({"openai": {"type": "function_call", "call_id": "c"}}).code == ErrorCode.UNKNOWN_ACTION


# -- output items --------------------------------------------------------------------------------------------------


def item_for(
    p: Plan, results: list[ActionResult], image: EncodedImage | None = None
) -> tuple[dict[str, Any], ActionError | None]:
    assert p.call is not None
    result, error = success_result(p.call, p.steps, results, image, p.scale)
    assert list(result) == ["item"]
    return checked_item(result["item"]), error


def test_a_computer_call_output_is_the_screenshot(plan: PlanFn) -> None:
    p = plan({"openai": computer_call(action={"type": "click", "button": "left", "x": 1, "y": 1})})
    item, error = item_for(p, [result_of({})], PNG)
    assert error is None
    assert item == {
        "type": "computer_call_output",
        "call_id": "call_c",
        "output": {"type": "computer_screenshot", "image_url": DATA_URL},
    }


def test_a_computer_call_output_acknowledges_the_checks_when_asked(plan: PlanFn) -> None:
    checks = [{"id": "sc_1", "code": "malicious_instructions", "message": "careful"}, {"id": "sc_2"}]
    p = plan({"openai": computer_call(checks, action={"type": "screenshot"}), "acknowledge_safety_checks": True})
    item, _ = item_for(p, [result_of({}, PNG)], PNG)
    assert list(item) == ["type", "call_id", "output", "acknowledged_safety_checks"]
    assert item["acknowledged_safety_checks"] == checks
    unasked = plan({"openai": computer_call(checks, action={"type": "screenshot"})})
    assert "acknowledged_safety_checks" not in item_for(unasked, [result_of({}, PNG)], PNG)[0]


def test_a_computer_call_refuses_to_go_without_its_screenshot(fail: FailFn) -> None:
    # Its output is the screen: a success without one would leave the caller nothing to send back.
    error = fail({"openai": computer_call(action={"type": "wait"}), "screenshot": False})
    assert (error.code, error.field) == (ErrorCode.INVALID_FIELD, "screenshot")


def execed(stdout: str = "", stderr: str = "", exit_code: int | None = 0, **more: Any) -> ActionResult:
    data = {"pid": 9, "exit_code": exit_code, "signal": None, "stdout": stdout, "stderr": stderr, "timed_out": False}
    return result_of({**data, "duration_ms": 1234.5, **more})


def test_a_shell_call_output_has_one_entry_per_command(plan: PlanFn) -> None:
    p = plan({"openai": shell_call(["echo hi", "false", "kill -9 $$"])})
    item, error = item_for(p, [execed("hi\n"), execed(exit_code=1), execed(exit_code=None, signal="SIGKILL")])
    assert error is None  # a command that exits non-zero is no failure
    assert item == {
        "type": "shell_call_output",
        "call_id": "call_s",
        "output": [
            {"stdout": "hi\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}},
            {"stdout": "", "stderr": "", "outcome": {"type": "exit", "exit_code": 1}},
            {"stdout": "", "stderr": "", "outcome": {"type": "exit", "exit_code": 137}},
        ],
    }


def test_a_shell_call_output_is_cut_to_max_output_length(plan: PlanFn) -> None:
    p = plan({"openai": shell_call(["a", "b"], max_output_length=5)})
    item, _ = item_for(p, [execed("abcdefgh", "err"), execed("ab", "cdefg")])
    assert item["max_output_length"] == 5
    assert [(e["stdout"], e["stderr"]) for e in item["output"]] == [("abcde", ""), ("ab", "cde")]


def test_a_shell_call_whose_command_timed_out(plan: PlanFn) -> None:
    p = plan({"openai": shell_call(["make", "sleep 99", "echo never"], timeout_ms=2000)})
    item, error = item_for(p, [execed("built\n"), execed("zz", exit_code=None, signal="SIGKILL", timed_out=True)])
    assert item["output"] == [
        {"stdout": "built\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}},
        {"stdout": "zz", "stderr": "", "outcome": {"type": "timeout"}},
        {"stdout": "", "stderr": "", "outcome": {"type": "timeout"}},  # not run: the budget was spent
    ]
    assert error is not None and error.code == ErrorCode.TIMEOUT
    assert error.field == "openai.action.commands[1]"
    assert error.message == "command 2 of 3 did not finish within the shell_call's 2000 ms; the 1 after it did not run"


def test_a_local_shell_call_output_is_json(plan: PlanFn) -> None:
    p = plan({"openai": local_shell_call(["ls"])})
    item, error = item_for(p, [execed("a\n", "warn\n", exit_code=2)])
    assert error is None
    assert list(item) == ["type", "id", "output"] and item["id"] == "call_l"
    assert json.loads(item["output"]) == {
        "output": "a\nwarn\n",
        "metadata": {"exit_code": 2, "duration_seconds": 1.234},
    }


def test_a_local_shell_call_that_timed_out(plan: PlanFn) -> None:
    p = plan({"openai": local_shell_call(["sleep", "9"], timeout_ms=10)})
    item, error = item_for(p, [execed("so far", exit_code=None, signal="SIGKILL", timed_out=True)])
    assert error is not None and error.code == ErrorCode.TIMEOUT
    assert json.loads(item["output"]) == {
        "output": "so far",
        "metadata": {"exit_code": None, "duration_seconds": 1.234},
        "error": error.to_dict(),
    }


def test_an_apply_patch_call_output(plan: PlanFn) -> None:
    p = plan({"openai": apply_patch_call({"type": "create_file", "path": "a.txt", "diff": "+x\n"})})
    item, error = item_for(p, [result_of({"output": "Created /workspace/a.txt", "path": "/workspace/a.txt"})])
    assert error is None
    assert item == {
        "type": "apply_patch_call_output",
        "call_id": "call_p",
        "status": "completed",
        "output": "Created /workspace/a.txt",
    }


# -- failures ------------------------------------------------------------------------------------------------------

PATCH_FAILED = ActionError(ErrorCode.PATCH_FAILED, "context not found in /workspace/a.py: 'def f():'")


@pytest.mark.parametrize(
    ("item", "error", "expected"),
    [
        (
            apply_patch_call({"type": "update_file", "path": "a.py", "diff": "@@ def f():\n-x\n+y\n"}),
            PATCH_FAILED,
            {
                "type": "apply_patch_call_output",
                "call_id": "call_p",
                "status": "failed",
                "output": PATCH_FAILED.message,
            },
        ),
        (
            shell_call(["ls"]),
            ActionError(ErrorCode.INVALID_FIELD, "bad", "openai.action.commands"),
            {
                "type": "shell_call_output",
                "call_id": "call_s",
                "output": [{"stdout": "", "stderr": "bad", "outcome": {"type": "exit", "exit_code": 1}}],
            },
        ),
        (
            shell_call(["ls"], max_output_length=10),
            ActionError(ErrorCode.TIMEOUT, "too slow"),
            {
                "type": "shell_call_output",
                "call_id": "call_s",
                "output": [{"stdout": "", "stderr": "too slow", "outcome": {"type": "timeout"}}],
                "max_output_length": 10,
            },
        ),
    ],
)
def test_a_failure_in_the_tools_own_form(item: dict[str, Any], error: ActionError, expected: dict[str, Any]) -> None:
    call = call_of({"openai": item})
    assert call is not None
    assert failure_result(call, error) == {"item": checked_item(expected)}


def test_a_local_shell_call_failure_has_the_error_in_its_json() -> None:
    call = call_of({"openai": local_shell_call(["id"], user="root")})
    assert call is not None
    error = ActionError(ErrorCode.INVALID_FIELD, "user 'root' cannot be served", "openai.action.user")
    result = failure_result(call, error)
    assert result is not None
    item = checked_item(result["item"])
    assert list(item) == ["type", "id", "output"]
    assert json.loads(item["output"]) == {"output": "", "error": error.to_dict()}


def test_a_failed_computer_call_answers_with_the_screen_if_it_can() -> None:
    call = call_of({"openai": computer_call(action={"type": "click", "button": "left", "x": 1, "y": 1})})
    assert call is not None
    error = ActionError(ErrorCode.TIMEOUT, "slow")
    assert failure_result(call, error) is None  # its output can carry nothing else
    result = failure_result(call, error, PNG)
    assert result is not None
    assert checked_item(result["item"]) == {
        "type": "computer_call_output",
        "call_id": "call_c",
        "output": {"type": "computer_screenshot", "image_url": DATA_URL},
    }


def test_a_shell_calls_limits_past_the_maximum_are_clamped(plan: PlanFn) -> None:
    p = plan({"openai": shell_call(["true"], timeout_ms=10**12, max_output_length=10**12)})
    assert natives(p) == [
        {
            "type": "exec",
            "command": "true",
            "timeout_ms": openai_tools.MAX_COMMAND_TIMEOUT_MS,
            "max_output_bytes": openai_tools.MAX_COMMAND_OUTPUT_BYTES,
        }
    ]
    assert p.call is not None and p.call.max_output_length == 10**12  # echoed as the model sent it
    local = plan({"openai": local_shell_call(["true"], timeout_ms=10**12)})
    assert natives(local)[0]["timeout_ms"] == openai_tools.MAX_COMMAND_TIMEOUT_MS


@pytest.mark.parametrize(
    ("item", "step_field", "native", "named"),
    [
        (
            shell_call(["a", "b"]),
            "openai.action.commands[1]",
            "action.max_output_bytes",
            "openai.action.max_output_length",
        ),
        (shell_call(["a"]), "openai.action.commands[0]", "action.timeout_ms", "openai.action.timeout_ms"),
        (
            shell_call(["a"]),
            "openai.action.commands[0]",
            "action.command",
            "openai.action.commands[0]",
        ),  # the command itself
        (local_shell_call(["ls"]), "openai.action", "action.cwd", "openai.action.working_directory"),
        (local_shell_call(["ls"]), "openai.action", "action.timeout_ms", "openai.action.timeout_ms"),
    ],
)
def test_a_native_errors_field_is_named_as_the_request_named_it(
    item: dict[str, Any], step_field: str, native: str, named: str
) -> None:
    call = call_of({"openai": item})
    assert vendor.request_field(call, step_field, native) == named
    assert vendor.request_field(None, "action", native) == native
