"""Anthropic's tools, whole ``tool_use`` blocks in and ``tool_result`` blocks out (pure: no I/O).

Served: the computer tool (``computer``: computer_20250124, computer_20251124) and the members of the
computer toolset (``toolset_name: "computer"``, one block per action, inputs as the SDK's
``BetaComputer*Input``); ``bash`` (bash_20250124, and agent_toolset_20260401's with ``timeout_ms``); the
text editors (``str_replace_based_edit_tool``: text_editor_20250728/20250429, no ``undo_edit``;
``str_replace_editor``: text_editor_20250124); and agent_toolset_20260401's ``edit``, ``read``,
``write``, ``glob`` and ``grep``. Any other name is ``unknown_tool``.
"""

from __future__ import annotations

import posixpath
from typing import Annotated, Any, Literal, NotRequired, Required, TypedDict

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from corral.errors import ActionError, ErrorCode
from corral.protocol import actions as a
from corral.protocol import anthropic
from corral.protocol.geometry import Scale, Size
from corral.protocol.plan import ActionResult, EncodedImage, Step
from corral.protocol.validation import validate
from corral.protocol.vendor.calls import COMPUTER_MEMBERS, COMPUTER_TOOL, COMPUTER_TOOLSET, VendorCall

EDITOR_TOOLS = ("str_replace_based_edit_tool", "str_replace_editor")
AGENT_FILE_TOOLS = ("edit", "read", "write", "glob", "grep")
SHELL_TOOL = "bash"
WORKDIR = a.DEFAULT_WORKDIR


class ShellArgs(TypedDict):
    """A native ``shell`` as the bash tool asks for it (validated into :class:`~corral.protocol.actions.Shell`)."""

    type: Literal["shell"]
    restart: bool
    split_stderr: bool
    command: NotRequired[str]
    timeout_ms: NotRequired[int]


class EditArgs(TypedDict, total=False):
    """A native ``edit`` as the editors and agent_toolset's ``edit``/``read`` ask for it."""

    type: Required[Literal["edit"]]
    command: Required[str]
    path: Required[str]
    view_range: tuple[int, int] | list[int]
    max_characters: int
    file_text: str
    old_str: str
    new_str: str
    insert_line: int
    replace_all: bool


class WriteArgs(TypedDict):
    type: Literal["file_write"]
    path: str
    content: str
    make_dirs: bool


class SearchArgs(TypedDict):
    type: Literal["file_glob", "file_grep"]
    pattern: str
    path: NotRequired[str]


class RepeatedKeyArgs(TypedDict):
    type: Literal["key"]
    keys: str
    repeat: object  # as the model sent it: the native model checks it


NativeArgs = ShellArgs | EditArgs | WriteArgs | SearchArgs | RepeatedKeyArgs


class ToolResultBlock(TypedDict):
    """A complete ``tool_result`` block (``BetaToolResultBlockParam``)."""

    type: Literal["tool_result"]
    tool_use_id: str
    content: list[anthropic.ContentBlock]
    is_error: NotRequired[bool]
    toolset_name: NotRequired[str]


class ToolUseBlock(BaseModel):
    """A ``tool_use`` content block as the Messages API returns it (``caller`` and later additions ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    type: Literal["tool_use"]
    id: Annotated[str, Field(min_length=1, max_length=256)]
    name: str
    input: dict[str, Any]  # the tool's input: each tool's own, read by the translators below
    toolset_name: str | None = None


class _Input(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BashInput(_Input):
    """bash_20250124's input, and agent_toolset_20260401's (``timeout_ms``: 0 or absent is the default)."""

    command: str | None = None
    restart: bool | None = None
    timeout_ms: Annotated[int, Field(ge=0)] | None = None


class EditorInput(_Input):
    """The text editor's input (all three versions); ``insert`` takes ``new_str`` or ``insert_text``."""

    command: Literal["view", "create", "str_replace", "insert", "undo_edit"]
    path: str
    file_text: str | None = None
    old_str: str | None = None
    new_str: str | None = None
    insert_text: str | None = None
    insert_line: int | None = None
    view_range: list[int] | None = None
    max_characters: int | None = None


class AgentEditInput(_Input):
    file_path: str
    old_string: str
    new_string: str
    replace_all: bool | None = None


class AgentReadInput(_Input):
    file_path: str
    view_range: list[int] | None = None


class AgentWriteInput(_Input):
    file_path: str
    content: str


class AgentSearchInput(_Input):
    """agent_toolset_20260401's ``glob`` and ``grep``."""

    pattern: str
    path: str | None = None


_BLOCK = TypeAdapter(ToolUseBlock)

# Each computer toolset member's input fields (anthropic.types.beta.BetaComputer*Input).
_POINTER = frozenset({"coordinate", "text"})
MEMBER_FIELDS: dict[str, frozenset[str]] = {
    "key": frozenset({"text", "repeat"}),
    "hold_key": frozenset({"text", "duration"}),
    "type": frozenset({"text"}),
    "cursor_position": frozenset(),
    "mouse_move": frozenset({"coordinate"}),
    "left_mouse_down": frozenset(),
    "left_mouse_up": frozenset(),
    "left_click": _POINTER,
    "left_click_drag": frozenset({"coordinate", "start_coordinate", "text"}),
    "right_click": _POINTER,
    "middle_click": _POINTER,
    "double_click": _POINTER,
    "triple_click": _POINTER,
    "scroll": frozenset({"coordinate", "text", "scroll_amount", "scroll_direction"}),
    "wait": frozenset({"duration"}),
    "screenshot": frozenset(),
    "zoom": frozenset({"region"}),
}
assert set(MEMBER_FIELDS) == set(COMPUTER_MEMBERS)


def read_block(raw: Any, field: str = "anthropic") -> ToolUseBlock:
    return validate(_BLOCK, raw, field)


def _native(data: NativeArgs, field: str, sources: dict[str, str] | None = None) -> a.NativeAction:
    """A native action; an error names the tool-input field it came from (``sources``: native -> input)."""
    try:
        return validate(a.native_action(), data, field, tagged=True)
    except ActionError as exc:
        if sources and exc.field is not None and exc.field.startswith(field + "."):
            leaf = exc.field[len(field) + 1 :].split(".")[0].split("[")[0]
            exc.field = f"{field}.{sources.get(leaf, leaf)}"
        raise


def _required(value: Any, name: str, command: str, field: str) -> Any:
    """The reference editor's check and wording for a parameter a command needs."""
    if value is None:
        raise ActionError(
            ErrorCode.MISSING_FIELD, f"Parameter `{name}` is required for command: {command}", field=f"{field}.{name}"
        )
    return value


def _range(view_range: list[int], field: str) -> tuple[int, int]:
    if len(view_range) != 2:
        raise ActionError(ErrorCode.INVALID_FIELD, "view_range is [start_line, end_line]", field=f"{field}.view_range")
    return view_range[0], view_range[1]


def _absolute(path: str) -> str:
    """agent_toolset paths: relative ones resolve against /workspace."""
    return path if path.startswith("/") else posixpath.join(WORKDIR, path)


def translate(block: ToolUseBlock, display: Size, field: str = "anthropic") -> list[Step]:
    """The native steps for one tool_use block; ``display`` is the screen size the model sees (zoom's budget)."""
    where = f"{field}.input"
    name = block.name
    if name == COMPUTER_TOOL:
        return [Step(action, where) for action in anthropic.translate(block.input, where)]
    if block.toolset_name == COMPUTER_TOOLSET:
        if name not in COMPUTER_MEMBERS:
            raise _unknown(block, field)
        return [Step(action, where) for action in _member(block, display, where)]
    if name == SHELL_TOOL:
        return [Step(_bash(block, where), where)]
    if name in EDITOR_TOOLS:
        return [Step(_editor(block, where), where)]
    if name in AGENT_FILE_TOOLS:
        return [Step(_agent_file_tool(block, where), where)]
    raise _unknown(block, field)


def _unknown(block: ToolUseBlock, field: str) -> ActionError:
    """``unknown_tool``, saying what is served (and, for a member name, that it needs its toolset)."""
    served = "computer, bash, str_replace_based_edit_tool, str_replace_editor, edit, read, write, glob, grep"
    message = f"Corral does not serve the tool {block.name!r} (it serves {served}, and the computer toolset's members)"
    if block.name in COMPUTER_MEMBERS:
        message += f"; {block.name!r} is a computer toolset member only with toolset_name 'computer'"
    return ActionError(ErrorCode.UNKNOWN_TOOL, message, f"{field}.name")


def _member(block: ToolUseBlock, display: Size, field: str) -> list[a.NativeAction]:
    """A computer toolset member through the computer tool's translator (same fields, one action each)."""
    name, raw = block.name, block.input
    extra = sorted(set(raw) - MEMBER_FIELDS[name])
    if extra:
        raise ActionError(
            ErrorCode.UNKNOWN_FIELD, f"unknown field {extra[0]!r} for {name!r}", field=f"{field}.{extra[0]}"
        )
    inp = {k: v for k, v in raw.items() if k != "repeat"}
    actions = anthropic.translate({"action": name, **inp}, field)
    if name == "key" and raw.get("repeat") is not None:
        key = actions[0]
        assert isinstance(key, a.Key)
        repeated: RepeatedKeyArgs = {"type": "key", "keys": key.keys, "repeat": raw["repeat"]}
        actions = [_native(repeated, field)]
    if name == "zoom":
        actions = [_fill_budget(action, display) for action in actions]
    return actions


def _fill_budget(action: a.NativeAction, display: Size) -> a.NativeAction:
    """A zoom's crop scaled up to fill the image budget (the display's size, aspect kept), as
    ``BetaComputerZoomInput`` says: fine details become legible."""
    if not isinstance(action, a.Zoom):
        return action
    region = action.region
    factor = min(display.width / region.width, display.height / region.height)
    return action.model_copy(update={"width": max(8, min(16_384, round(region.width * factor)))})


def _bash(block: ToolUseBlock, field: str) -> a.NativeAction:
    inp = validate(TypeAdapter(BashInput), block.input, field)
    if inp.command is None and not inp.restart:
        raise ActionError(ErrorCode.MISSING_FIELD, "no command provided.", field)  # the reference's words
    # stderr apart, as the reference bash tool keeps it: a command that wrote to it is an is_error result.
    data: ShellArgs = {"type": "shell", "restart": bool(inp.restart), "split_stderr": True}
    if inp.command is not None:
        data["command"] = inp.command
    if inp.timeout_ms:
        data["timeout_ms"] = inp.timeout_ms
    return _native(data, field)


def _editor(block: ToolUseBlock, field: str) -> a.NativeAction:
    name, inp = block.name, validate(TypeAdapter(EditorInput), block.input, field)
    command = inp.command
    if command == "undo_edit" and name == "str_replace_based_edit_tool":
        raise ActionError(
            ErrorCode.INVALID_FIELD,
            "undo_edit is not a command of str_replace_based_edit_tool (text_editor_20250728/20250429); "
            "allowed: view, create, str_replace, insert",
            field=f"{field}.command",
        )
    data: EditArgs = {"type": "edit", "command": command, "path": inp.path}
    if command == "view":
        if inp.view_range:  # [] shows the whole file, as the reference's ``if view_range`` does
            data["view_range"] = _range(inp.view_range, field)
        if inp.max_characters is not None:
            data["max_characters"] = inp.max_characters
    elif command == "create":
        data["file_text"] = _required(inp.file_text, "file_text", command, field)
    elif command == "str_replace":
        data["old_str"] = _required(inp.old_str, "old_str", command, field)
        if inp.new_str is not None:
            data["new_str"] = inp.new_str
    elif command == "insert":
        data["insert_line"] = _required(inp.insert_line, "insert_line", command, field)
        text = inp.new_str if inp.new_str is not None else inp.insert_text
        data["new_str"] = _required(text, "new_str", command, field)
    return _native(data, field, {"new_str": "new_str" if inp.new_str is not None else "insert_text"})


_AGENT_SOURCES = {"path": "file_path", "old_str": "old_string", "new_str": "new_string", "content": "content"}


def _agent_file_tool(block: ToolUseBlock, field: str) -> a.NativeAction:
    name, raw = block.name, block.input
    if name == "edit":
        edit = validate(TypeAdapter(AgentEditInput), raw, field)
        data: EditArgs = {
            "type": "edit",
            "command": "str_replace",
            "path": _absolute(edit.file_path),
            "old_str": edit.old_string,
            "new_str": edit.new_string,
            "replace_all": bool(edit.replace_all),
        }
        return _native(data, field, _AGENT_SOURCES)
    if name == "read":
        read = validate(TypeAdapter(AgentReadInput), raw, field)
        view: EditArgs = {"type": "edit", "command": "view", "path": _absolute(read.file_path)}
        if read.view_range is not None:
            first, last = _range(read.view_range, field)
            view["view_range"] = [first, last if last > 0 else -1]  # end <= 0: to the end of the file
        return _native(view, field, _AGENT_SOURCES)
    if name == "write":
        write = validate(TypeAdapter(AgentWriteInput), raw, field)
        written: WriteArgs = {
            "type": "file_write",
            "path": _absolute(write.file_path),
            "content": write.content,
            "make_dirs": True,
        }
        return _native(written, field, _AGENT_SOURCES)
    search = validate(TypeAdapter(AgentSearchInput), raw, field)
    found: SearchArgs = {"type": "file_glob" if name == "glob" else "file_grep", "pattern": search.pattern}
    if search.path is not None:
        found["path"] = _absolute(search.path)
    return _native(found, field)


def default_screenshot(block: Any) -> bool:
    """Whether the tool_result carries a screenshot unless the request says: the computer tools' actions
    do (all but cursor_position); the shell, editor and file tools do not."""
    if not isinstance(block, dict):
        return False
    name, inp = block.get("name"), block.get("input")
    if name == COMPUTER_TOOL:
        return anthropic.wants_screenshot(str(inp.get("action") if isinstance(inp, dict) else None))
    if block.get("toolset_name") == COMPUTER_TOOLSET and name in COMPUTER_MEMBERS:
        return anthropic.wants_screenshot(str(name))
    return False


# -- replies ----------------------------------------------------------------------------------------------------


def _text(text: str) -> list[anthropic.ContentBlock]:
    """A text block, or none: the Messages API refuses an empty text block (the reference tools send none)."""
    return [{"type": "text", "text": text}] if text else []


def tool_result(call: VendorCall, content: list[anthropic.ContentBlock], is_error: bool = False) -> ToolResultBlock:
    """A complete ``tool_result`` block (``BetaToolResultBlockParam``) for ``call``."""
    block: ToolResultBlock = {"type": "tool_result", "tool_use_id": call.call_id, "content": content}
    if is_error:
        block["is_error"] = True
    if call.toolset_name is not None:
        block["toolset_name"] = call.toolset_name
    return block


def result_text(action: a.NativeAction, result: ActionResult) -> str:
    """What a shell, editor or file tool's native result says to the model."""
    data = result.data
    if isinstance(action, a.FileWrite):
        return f"Wrote {data.get('size', 0)} bytes to {data.get('path', action.path)}"
    if isinstance(action, a.FileGlob):
        paths = [str(p) for p in data.get("paths") or []]
        text = "\n".join(paths) if paths else "No files found"
        return text + ("\n(results truncated)" if data.get("truncated") else "")
    if isinstance(action, a.FileGrep):
        lines = [f"{m.get('path')}:{m.get('line')}:{m.get('text')}" for m in data.get("matches") or []]
        text = "\n".join(lines) if lines else "No matches found"
        return text + ("\n(results truncated)" if data.get("truncated") else "")
    return str(data.get("output") or "")


def _shell_text(output: str, stderr: str) -> str:
    """A bash result's text: stdout, then stderr (the reference shows stderr alone when there is any;
    Corral keeps the output too, so the model loses nothing)."""
    if output and stderr and not output.endswith("\n"):
        return f"{output}\n{stderr}"
    return output + stderr


def success(
    call: VendorCall,
    steps: tuple[Step, ...],
    results: list[ActionResult],
    image: EncodedImage | None,
    scale: Scale | None,
) -> ToolResultBlock:
    """The tool_result for a call whose steps all ran."""
    last_action, last = steps[-1].action, results[-1]
    if call.computer:
        return tool_result(call, anthropic.tool_result_content(last_action, last, image, scale))
    stderr = str(last.data.get("stderr") or "") if isinstance(last_action, a.Shell) else ""
    # The reference bash tool's marking: a command that wrote to stderr is an error (computer_use_demo
    # loop.py's _make_api_tool_result: is_error when the result has an error); its exit code is not.
    text = _shell_text(result_text(last_action, last), stderr) if stderr else result_text(last_action, last)
    content = _text(text)
    if image is not None:  # asked for with the envelope's ``screenshot``
        content.append(anthropic.image_block(image))
    return tool_result(call, content, is_error=bool(stderr))


def failure(call: VendorCall, error: ActionError) -> ToolResultBlock:
    """The ``is_error`` tool_result: the error's message, as the model reads it (no text block for an
    empty one: the Messages API refuses an empty text block)."""
    return tool_result(call, _text(error.message), is_error=True)
