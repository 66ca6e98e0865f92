"""OpenAI's tools, whole Responses output items in and input items out (pure: no I/O).

Served: ``computer_call`` (the GA computer tool: ``action`` or ``actions[]``), ``shell_call``,
``local_shell_call`` and ``apply_patch_call``; each answered with its ``*_output`` item.
"""

from __future__ import annotations

import json
import posixpath
import signal
from collections.abc import Sequence
from typing import Annotated, Any, Literal, NotRequired, Required, TypedDict

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from corral.errors import ActionError, ErrorCode, ErrorDetail
from corral.protocol import actions as a
from corral.protocol import openai
from corral.protocol.plan import ActionResult, EncodedImage, Step
from corral.protocol.validation import validate
from corral.protocol.vendor.calls import SafetyCheck, VendorCall

WORKDIR = a.DEFAULT_WORKDIR
AGENT_USER = "agent"


class ExecArgs(TypedDict, total=False):
    """A native ``exec`` as a shell_call's command or a local_shell_call asks for it."""

    type: Required[Literal["exec"]]
    command: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    timeout_ms: int | None
    max_output_bytes: int


class PatchArgs(TypedDict):
    type: Literal["apply_patch"]
    operation: str
    path: str
    diff: NotRequired[str]


class ComputerCallOutput(TypedDict):
    type: Literal["computer_call_output"]
    call_id: str
    output: dict[str, str]
    acknowledged_safety_checks: NotRequired[list[SafetyCheck]]


class ShellOutcome(TypedDict):
    type: Literal["exit", "timeout"]
    exit_code: NotRequired[int]


class ShellEntry(TypedDict):
    stdout: str
    stderr: str
    outcome: ShellOutcome


class ShellCallOutput(TypedDict):
    type: Literal["shell_call_output"]
    call_id: str
    output: list[ShellEntry]
    max_output_length: NotRequired[int]


class LocalShellMetadata(TypedDict):
    exit_code: Any  # the result's, then the exit code as a shell says it (_exit_code)
    duration_seconds: float


class LocalShellBody(TypedDict):
    """What a local_shell_call_output's ``output`` holds, as JSON text."""

    output: str
    metadata: NotRequired[LocalShellMetadata]
    error: NotRequired[ErrorDetail]


class LocalShellCallOutput(TypedDict):
    type: Literal["local_shell_call_output"]
    id: str
    output: str


class ApplyPatchCallOutput(TypedDict):
    type: Literal["apply_patch_call_output"]
    call_id: str
    status: Literal["completed", "failed"]
    output: str


OutputItemParam = ComputerCallOutput | ShellCallOutput | LocalShellCallOutput | ApplyPatchCallOutput
"""An output item Corral gives back (the Responses API's ``*_output`` input items)."""


class _Item(BaseModel):
    """Fields every item has (``id``, ``status``, ``caller``, ``created_by``, ... are ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    call_id: Annotated[str, Field(min_length=1, max_length=256)]


class ComputerCall(_Item):
    type: Literal["computer_call"]
    # The model's action(s), each as the SDK dumps it: read by corral.protocol.openai's translator.
    action: dict[str, Any] | None = None
    actions: list[dict[str, Any]] | None = None


class ShellAction(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    commands: Annotated[list[str], Field(min_length=1, max_length=100)]
    timeout_ms: Annotated[int, Field(ge=1)] | None = None  # over the maximum: the maximum (_clamped)
    max_output_length: Annotated[int, Field(ge=0)] | None = None


class ShellCall(_Item):
    type: Literal["shell_call"]
    action: ShellAction


class LocalShellAction(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    type: Literal["exec"]
    command: Annotated[list[str], Field(min_length=1)]
    env: dict[str, str] = Field(default_factory=dict)
    timeout_ms: Annotated[int, Field(ge=1)] | None = None  # over the maximum: the maximum (_clamped)
    working_directory: str | None = None
    user: str | None = None


class LocalShellCall(_Item):
    type: Literal["local_shell_call"]
    action: LocalShellAction


class PatchOperation(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    type: a.PatchOperation
    path: str
    diff: str | None = None


class ApplyPatchCall(_Item):
    type: Literal["apply_patch_call"]
    operation: PatchOperation


OutputItem = Annotated[ComputerCall | ShellCall | LocalShellCall | ApplyPatchCall, Field(discriminator="type")]
_ITEM: TypeAdapter[OutputItem] = TypeAdapter(OutputItem)


# What a model may ask of a command, clamped rather than refused (a model picks these numbers; the
# call should still run): the controller's default maximum timeout (ControllerSettings'
# max_action_timeout_ms) and the process table's default maximum bytes per stream
# (ControllerSettings.max_output_bytes). A controller configured lower still refuses, and the error
# names the request's own field (request_field).
MAX_COMMAND_TIMEOUT_MS = 600_000
MAX_COMMAND_OUTPUT_BYTES = 8 << 20
# A native exec's fields as a shell_call and a local_shell_call name them.
_SHELL_FIELDS = {"timeout_ms": "timeout_ms", "max_output_bytes": "max_output_length"}
_LOCAL_SHELL_FIELDS = {"argv": "command", "cwd": "working_directory"}


def _clamped_timeout(timeout_ms: int | None) -> int | None:
    return None if timeout_ms is None else min(timeout_ms, MAX_COMMAND_TIMEOUT_MS)


def request_field(call: VendorCall, step_field: str, native: str) -> str:
    """A native action's field (``action.max_output_bytes``) as the request named it
    (``openai.action.max_output_length`` for a shell_call's commands, else under the step's field)."""
    rest = native[len("action") :]
    if call.tool == "shell_call" and "[" in step_field:
        base = step_field[: step_field.rindex(".commands[")]  # "openai.action"
        name = rest.lstrip(".").split(".", 1)[0]
        if name in _SHELL_FIELDS:
            return f"{base}.{_SHELL_FIELDS[name]}"
        if name == "command":  # the exec's command is the item's commands[i] itself
            return step_field
    if call.tool == "local_shell_call":
        name, _, tail = rest.lstrip(".").partition(".")
        if name in _LOCAL_SHELL_FIELDS:
            return f"{step_field}.{_LOCAL_SHELL_FIELDS[name]}" + (f".{tail}" if tail else "")
    return step_field + rest


def read_item(raw: Any, field: str = "openai") -> OutputItem:
    return validate(_ITEM, raw, field, tagged=True)


def _native(data: ExecArgs | PatchArgs, field: str) -> a.NativeAction:
    return validate(a.native_action(), data, field, tagged=True)


def _set(action: dict[str, Any]) -> dict[str, Any]:
    """An action as the SDK's ``model_dump()`` gives it, without the fields it left unset (None)."""
    return {key: value for key, value in action.items() if value is not None}


def translate(item: OutputItem, field: str = "openai") -> list[Step]:
    """The native steps for one output item."""
    if isinstance(item, ComputerCall):
        if item.actions:
            batch = [_set(action) for action in item.actions]
            return [Step(action, where) for action, where in openai.translate(batch, f"{field}.actions")]
        if item.action is None:
            raise ActionError(ErrorCode.MISSING_FIELD, "a computer_call needs 'action' or 'actions'", f"{field}.action")
        return [Step(action, where) for action, where in openai.translate(_set(item.action), f"{field}.action")]
    if isinstance(item, ShellCall):
        budget = _clamped_timeout(item.action.timeout_ms) or a.SHELL_TIMEOUT_MS
        limit = item.action.max_output_length
        where = f"{field}.action.commands"
        steps = []
        for i, command in enumerate(item.action.commands):
            data: ExecArgs = {"type": "exec", "command": command, "timeout_ms": budget}
            if limit is not None:
                # Each stream's bytes: enough for max_output_length characters of UTF-8 (cut to them in the
                # reply), up to what the process table gives at most.
                data["max_output_bytes"] = min(4 * limit, MAX_COMMAND_OUTPUT_BYTES)
            steps.append(Step(_native(data, f"{where}[{i}]"), f"{where}[{i}]"))
        return steps
    if isinstance(item, LocalShellCall):
        return [Step(_local_exec(item.action, f"{field}.action"), f"{field}.action")]
    op = item.operation
    patch: PatchArgs = {"type": "apply_patch", "operation": op.type, "path": op.path}
    if op.diff is not None and op.type != "delete_file":
        patch["diff"] = op.diff
    return [Step(_native(patch, f"{field}.operation"), f"{field}.operation")]


def _local_exec(action: LocalShellAction, field: str) -> a.NativeAction:
    if action.user not in (None, AGENT_USER):
        raise ActionError(
            ErrorCode.INVALID_FIELD,
            f"commands run as the sandbox's agent user; user {action.user!r} cannot be served",
            field=f"{field}.user",
        )
    data: ExecArgs = {"type": "exec", "argv": action.command, "env": action.env}
    if action.working_directory:
        data["cwd"] = posixpath.join(WORKDIR, action.working_directory)  # an absolute one stays as it is
    if action.timeout_ms is not None:
        data["timeout_ms"] = _clamped_timeout(action.timeout_ms)
    try:
        return _native(data, field)
    except ActionError as exc:
        if exc.field is not None:
            exc.field = exc.field.replace(f"{field}.argv", f"{field}.command").replace(
                f"{field}.cwd", f"{field}.working_directory"
            )
        raise


def next_action(
    call: VendorCall, action: a.NativeAction, ran: Sequence[ActionResult], spent_ms: float
) -> a.NativeAction | None:
    """The step to run next of a shell_call, or None to stop: its commands share one timeout budget (each
    exec was planned with the whole budget; it gets what is left), and none runs after one timed out."""
    if call.tool != "shell_call" or not isinstance(action, a.Exec):
        return action
    if not ran:
        return action
    if any(result.data.get("timed_out") for result in ran):
        return None
    left = int((action.timeout_ms or a.SHELL_TIMEOUT_MS) - spent_ms)
    return None if left < 1 else action.model_copy(update={"timeout_ms": left})


def answers_each_step(call: VendorCall) -> bool:
    """A shell_call's commands answer one entry each: a command that cannot run (``process_limit``,
    ``exec_failed``, ...) is its own failed entry, and the others still run and keep their output."""
    return call.tool == "shell_call"


def default_screenshot(item: Any) -> bool:
    """A computer_call's output is its screenshot; the other tools' outputs have none."""
    return isinstance(item, dict) and item.get("type") == "computer_call"


# -- replies ----------------------------------------------------------------------------------------------------

Reply = tuple[OutputItemParam | None, ActionError | None]
"""An output item (None: none can be given) and the error the reply reports with it (None: ok)."""


def computer_call_output(call: VendorCall, image: EncodedImage) -> ComputerCallOutput:
    item: ComputerCallOutput = {
        "type": "computer_call_output",
        "call_id": call.call_id,
        "output": openai.call_output(image),
    }
    if call.acknowledged:
        item["acknowledged_safety_checks"] = [check.copy() for check in call.acknowledged]
    return item


def _exit_code(result: ActionResult) -> int:
    """An exec's exit code; killed by a signal: 128 + its number, as a shell says it."""
    data = result.data
    code = data.get("exit_code")
    if isinstance(code, int):
        return code
    name = data.get("signal")
    try:
        return 128 + signal.Signals[str(name)].value
    except KeyError:
        return -1


def _cut(stdout: str, stderr: str, limit: int | None) -> tuple[str, str]:
    """stdout and stderr together within ``limit`` characters (stdout's first)."""
    if limit is None:
        return stdout, stderr
    stdout = stdout[:limit]
    return stdout, stderr[: limit - len(stdout)]


def _shell_entry(result: ActionResult | None, limit: int | None) -> ShellEntry:
    if result is None:  # not run: the budget was spent
        return {"stdout": "", "stderr": "", "outcome": {"type": "timeout"}}
    data = result.data
    error = data.get("error")
    if isinstance(error, dict):  # it could not run: the message, as failure() gives it
        return {"stdout": "", "stderr": str(error.get("message") or ""), "outcome": {"type": "exit", "exit_code": 1}}
    stdout, stderr = _cut(str(data.get("stdout") or ""), str(data.get("stderr") or ""), limit)
    outcome: ShellOutcome = (
        {"type": "timeout"} if data.get("timed_out") else {"type": "exit", "exit_code": _exit_code(result)}
    )
    return {"stdout": stdout, "stderr": stderr, "outcome": outcome}


def shell_call_output(call: VendorCall, entries: list[ShellEntry]) -> ShellCallOutput:
    item: ShellCallOutput = {"type": "shell_call_output", "call_id": call.call_id, "output": entries}
    if call.max_output_length is not None:
        item["max_output_length"] = call.max_output_length
    return item


def _shell_success(call: VendorCall, steps: tuple[Step, ...], results: list[ActionResult]) -> Reply:
    entries = [
        _shell_entry(results[i] if i < len(results) else None, call.max_output_length) for i in range(len(steps))
    ]
    timed_out = [i for i, entry in enumerate(entries) if entry["outcome"]["type"] == "timeout"]
    failed = [i for i, result in enumerate(results) if isinstance(result.data.get("error"), dict)]
    if failed and (not timed_out or failed[0] < timed_out[0]):
        error = results[failed[0]].data["error"]
        code, field = ErrorCode(error["code"]), error.get("field")
        return shell_call_output(call, entries), ActionError(code, str(error["message"]), field=field)
    if not timed_out:
        return shell_call_output(call, entries), None
    first = steps[timed_out[0]].action
    budget = first.timeout_ms if isinstance(first, a.Exec) else None
    later = len(steps) - timed_out[0] - 1
    message = f"command {timed_out[0] + 1} of {len(steps)} did not finish within the shell_call's {budget} ms" + (
        f"; the {later} after it did not run" if later else ""
    )
    return shell_call_output(call, entries), ActionError(ErrorCode.TIMEOUT, message, field=steps[timed_out[0]].field)


def local_shell_call_output(call: VendorCall, body: LocalShellBody) -> LocalShellCallOutput:
    """``output`` is JSON text: ``{"output": stdout+stderr, "metadata": {...}}`` (and ``error`` on failure)."""
    return {"type": "local_shell_call_output", "id": call.call_id, "output": json.dumps(body, separators=(",", ":"))}


def _local_shell_success(call: VendorCall, result: ActionResult) -> Reply:
    data = result.data
    metadata: LocalShellMetadata = {
        "exit_code": data.get("exit_code"),
        "duration_seconds": round(float(data.get("duration_ms") or 0) / 1000, 3),
    }
    body: LocalShellBody = {
        "output": str(data.get("stdout") or "") + str(data.get("stderr") or ""),
        "metadata": metadata,
    }
    if not data.get("timed_out"):
        metadata["exit_code"] = _exit_code(result)
        return local_shell_call_output(call, body), None
    error = ActionError(
        ErrorCode.TIMEOUT, "the command did not finish within its timeout_ms", field="openai.action.timeout_ms"
    )
    body["error"] = error.to_dict()
    return local_shell_call_output(call, body), error


def apply_patch_call_output(
    call: VendorCall, status: Literal["completed", "failed"], output: str
) -> ApplyPatchCallOutput:
    return {"type": "apply_patch_call_output", "call_id": call.call_id, "status": status, "output": output}


def success(
    call: VendorCall, steps: tuple[Step, ...], results: list[ActionResult], image: EncodedImage | None
) -> Reply:
    """The output item for a call whose steps ran (a shell_call's commands may have timed out: then the
    item and a ``timeout`` error)."""
    if call.tool == "computer_call":
        return (computer_call_output(call, image) if image is not None else None), None
    if call.tool == "shell_call":
        return _shell_success(call, steps, results)
    if call.tool == "local_shell_call":
        return _local_shell_success(call, results[-1])
    return apply_patch_call_output(call, "completed", str(results[-1].data.get("output") or "")), None


def failure(call: VendorCall, error: ActionError, image: EncodedImage | None = None) -> OutputItemParam | None:
    """The output item that tells the model ``error``, in the tool's own form; None for a computer_call
    with no screenshot (its output can carry nothing else)."""
    if call.tool == "computer_call":
        return computer_call_output(call, image) if image is not None else None
    if call.tool == "shell_call":
        if error.code == ErrorCode.TIMEOUT:
            entry: ShellEntry = {"stdout": "", "stderr": error.message, "outcome": {"type": "timeout"}}
        else:
            entry = {"stdout": "", "stderr": error.message, "outcome": {"type": "exit", "exit_code": 1}}
        return shell_call_output(call, [entry])
    if call.tool == "local_shell_call":
        return local_shell_call_output(call, {"output": "", "error": error.to_dict()})
    return apply_patch_call_output(call, "failed", error.message)
