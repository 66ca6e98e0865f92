"""The vendors' tool calls as their APIs return them, and their replies held to the vendors' own SDK
param types: what the vendor-tools tests send through the real gateway and how they read the answer.

A reply is valid when pydantic's ``TypeAdapter`` of the SDK's TypedDict accepts it (every lazy
``Iterable`` field drained, so its items are checked too) AND no object in it carries a key its
TypedDict does not declare (TypedDicts ignore unknown keys; the vendors' APIs refuse them)."""

from __future__ import annotations

import base64
import io
import itertools
import typing
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import cache
from typing import Any

from anthropic.types.beta import BetaToolResultBlockParam
from openai.types.responses import (
    ResponseApplyPatchToolCall,
    ResponseComputerToolCall,
    ResponseFunctionShellToolCall,
)
from openai.types.responses.response_input_item_param import (
    ApplyPatchCallOutput,
    ComputerCallOutput,
    LocalShellCallOutput,
    ShellCallOutput,
)
from openai.types.responses.response_output_item import LocalShellCall
from PIL import Image
from pydantic import PydanticSchemaGenerationError, TypeAdapter, ValidationError
from typing_extensions import is_typeddict

from corral.sdk import Sandbox

from .gateway_fixtures import RunningGateway

OPENAI_OUTPUTS: dict[str, type[Any]] = {
    "computer_call": ComputerCallOutput,
    "shell_call": ShellCallOutput,
    "local_shell_call": LocalShellCallOutput,
    "apply_patch_call": ApplyPatchCallOutput,
}
_ids = itertools.count(1)

# The test pages (conftest.open_page): a red button and a blue text input reporting through the title.
RED = (255, 0, 0)
BLUE = (0, 0, 255)
SCREEN = (1280, 800)
INPUT_PAGE = '<input id=i style="position:absolute;left:100px;top:100px;width:400px;height:40px;background:#00f">'
INPUT_JS = "const i = document.getElementById('i'); i.addEventListener('input', () => { document.title = i.value; });"


# -- the vendors' calls, as their APIs return them --------------------------------------------------------


def tool_use(
    name: str, tool_input: Any, *, toolset_name: str | None = None, block_id: str | None = None
) -> dict[str, Any]:
    """A Messages API ``tool_use`` content block."""
    block: dict[str, Any] = {"type": "tool_use", "id": block_id or f"toolu_{next(_ids):04d}", "name": name}
    block["input"] = tool_input
    if toolset_name is not None:
        block["toolset_name"] = toolset_name
    return block


def member(name: str, **tool_input: Any) -> dict[str, Any]:
    """A computer toolset member's ``tool_use`` block (computer_toolset_20260801)."""
    return tool_use(name, tool_input, toolset_name="computer")


def computer_call(*actions: dict[str, Any], pending: Sequence[dict[str, str]] = ()) -> dict[str, Any]:
    """A GA ``computer_call`` output item with ``actions[]`` (one action: ``action``)."""
    n = next(_ids)
    item: dict[str, Any] = {
        "id": f"cu_{n:04d}",
        "call_id": f"call_{n:04d}",
        "type": "computer_call",
        "status": "completed",
        "pending_safety_checks": list(pending),
    }
    if len(actions) == 1:
        item["action"] = actions[0]
    else:
        item["actions"] = list(actions)
    return ResponseComputerToolCall.model_validate(item).model_dump(mode="json", exclude_none=True)


def shell_call(*commands: str, timeout_ms: int | None = None, max_output_length: int | None = None) -> dict[str, Any]:
    n = next(_ids)
    action: dict[str, Any] = {
        "commands": list(commands),
        "timeout_ms": timeout_ms,
        "max_output_length": max_output_length,
    }
    item = {"id": f"sh_{n:04d}", "call_id": f"call_{n:04d}", "type": "shell_call", "status": "completed"}
    return ResponseFunctionShellToolCall.model_validate({**item, "action": action}).model_dump(
        mode="json", exclude_none=True
    )


def local_shell_call(
    command: list[str],
    *,
    env: Mapping[str, str] | None = None,
    working_directory: str | None = None,
    timeout_ms: int | None = None,
    user: str | None = None,
) -> dict[str, Any]:
    n = next(_ids)
    action = {
        "type": "exec",
        "command": command,
        "env": dict(env or {}),
        "working_directory": working_directory,
        "timeout_ms": timeout_ms,
        "user": user,
    }
    item = {"id": f"lsh_{n:04d}", "call_id": f"call_{n:04d}", "type": "local_shell_call", "status": "completed"}
    return LocalShellCall.model_validate({**item, "action": action}).model_dump(mode="json", exclude_none=True)


def apply_patch_call(operation: str, path: str, diff: str | None = None) -> dict[str, Any]:
    n = next(_ids)
    op: dict[str, Any] = {"type": operation, "path": path}
    if diff is not None:
        op["diff"] = diff
    item = {"id": f"apc_{n:04d}", "call_id": f"call_{n:04d}", "type": "apply_patch_call", "status": "completed"}
    return ResponseApplyPatchToolCall.model_validate({**item, "operation": op}).model_dump(
        mode="json", exclude_none=True
    )


# -- sending them ----------------------------------------------------------------------------------------


def over_http(gw: RunningGateway, sb: Sandbox, message: dict[str, Any]) -> dict[str, Any]:
    """One message through ``POST /v1/sessions/{id}/actions`` (the WebSocket's twin)."""
    with gw.client() as c:
        response = c.post(f"/v1/sessions/{sb.id}/actions", json=message)
    assert response.headers["content-type"].startswith("application/json"), response.text
    reply: dict[str, Any] = response.json()
    assert (response.status_code == 200) is reply["ok"], (response.status_code, reply)  # a failure: 4xx or 5xx
    return reply


# -- reading the replies ---------------------------------------------------------------------------------


def tool_result(
    reply: dict[str, Any], block: dict[str, Any], *, ok: bool = True, is_error: bool | None = None
) -> dict[str, Any]:
    """The reply's ``tool_result``, checked: ``ok`` as expected, a valid ``BetaToolResultBlockParam``
    for ``block`` (its id; its toolset_name echoed; ``is_error`` exactly when it failed, or, for a
    bash command that ran, when ``is_error`` says: one that wrote to stderr, as the reference marks it)."""
    marked = not ok if is_error is None else is_error
    assert next(iter(reply)) == "ok" and reply["ok"] is ok, reply
    if not ok:
        assert set(reply["error"]) <= {"code", "message", "field"} and reply["error"]["message"], reply
    result = reply["result"]["tool_result"]
    check_shape(BetaToolResultBlockParam, result)
    assert result["type"] == "tool_result" and result["tool_use_id"] == block["id"], result
    expected = {"type", "tool_use_id", "content"} | ({"toolset_name"} if "toolset_name" in block else set())
    expected |= {"is_error"} if marked else set()
    assert set(result) == expected, result
    if "toolset_name" in block:
        assert result["toolset_name"] == block["toolset_name"]
    if marked:
        assert result["is_error"] is True
    # The Messages API refuses an empty text block: no output is no block.
    assert all(b["text"] for b in result.get("content") or [] if isinstance(b, dict) and b["type"] == "text"), result
    return typing.cast(dict[str, Any], result)


def cat(sb: Sandbox, path: str) -> str:
    """A file of the session as text."""
    return sb.files.read(path).decode()


def text_of(result: dict[str, Any]) -> str:
    """The text blocks of a tool_result, joined."""
    if isinstance(result["content"], str):
        return result["content"]
    return "".join(block["text"] for block in result["content"] if block["type"] == "text")


def image_of(result: dict[str, Any]) -> Image.Image:
    [image] = [block for block in result["content"] if block["type"] == "image"]
    assert image["source"]["type"] == "base64" and image["source"]["media_type"] in ("image/png", "image/jpeg")
    return Image.open(io.BytesIO(base64.b64decode(image["source"]["data"])))


def item(reply: dict[str, Any], call: dict[str, Any], *, ok: bool = True) -> dict[str, Any]:
    """The reply's output item for an OpenAI ``call``, checked against the SDK's input item param type,
    with the call's id set where the type wants it."""
    assert next(iter(reply)) == "ok" and reply["ok"] is ok, reply
    if not ok:
        assert set(reply["error"]) <= {"code", "message", "field"} and reply["error"]["message"], reply
    out = reply["result"]["item"]
    check_shape(OPENAI_OUTPUTS[call["type"]], out)
    assert out["type"] == call["type"] + "_output", out
    if call["type"] == "local_shell_call":
        assert out["id"] == call["call_id"], out
    else:
        assert out["call_id"] == call["call_id"], out
    return typing.cast(dict[str, Any], out)


def screenshot_of(out: dict[str, Any]) -> Image.Image:
    """The image of a ``computer_call_output``."""
    screenshot = out["output"]
    assert screenshot["type"] == "computer_screenshot" and set(screenshot) == {"type", "image_url"}, screenshot
    head, _, data = screenshot["image_url"].partition(",")
    assert head in ("data:image/png;base64", "data:image/jpeg;base64"), head
    return Image.open(io.BytesIO(base64.b64decode(data)))


# -- the shape check -------------------------------------------------------------------------------------


def check_shape(tp: Any, value: Any) -> None:
    """``value`` is a ``tp`` (a vendor SDK TypedDict): validated, lazily validated items drained, and
    no unknown key anywhere."""
    try:
        _drain(_adapter(tp).validate_python(value))
    except ValidationError as exc:
        raise AssertionError(f"not a {tp.__name__}: {exc}\n{_short(value)}") from None
    unknown = _unknown_keys(tp, value, "")
    assert unknown is not None and not unknown, f"keys a {tp.__name__} does not have: {unknown}\n{_short(value)}"


@cache
def _adapter(tp: Any) -> TypeAdapter[Any]:
    return TypeAdapter(tp)


def _drain(value: Any) -> Any:
    """pydantic validates an ``Iterable`` field lazily: iterate every one so its items are checked."""
    if isinstance(value, dict):
        return {k: _drain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_drain(v) for v in value]
    if isinstance(value, Iterator):
        return [_drain(v) for v in value]
    return value


def _valid(tp: Any, value: Any) -> bool:
    try:
        _drain(_adapter(tp).validate_python(value))
    except (ValidationError, TypeError, PydanticSchemaGenerationError):  # the last: IO[bytes], never JSON's
        return False
    return True


def _unknown_keys(tp: Any, value: Any, where: str) -> list[str] | None:
    """The paths of keys in ``value`` that ``tp`` does not declare; None when ``value`` is no ``tp``."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        found = [
            u for m in typing.get_args(tp) if _valid(m, value) and (u := _unknown_keys(m, value, where)) is not None
        ]
        return min(found, key=len) if found else None
    if is_typeddict(tp):
        if not isinstance(value, dict):
            return None
        declared = typing.get_type_hints(tp)
        unknown = [f"{where}.{key}" for key in value if key not in declared]
        for key, field in declared.items():
            if key in value:
                inner = _unknown_keys(field, value[key], f"{where}.{key}")
                if inner is None:
                    return None
                unknown += inner
        return unknown
    if isinstance(value, list) and _is_collection(origin):
        args = typing.get_args(tp)
        unknown = []
        for i, element in enumerate(value):
            inner = _unknown_keys(args[0], element, f"{where}[{i}]") if args else []
            if inner is None:
                return None
            unknown += inner
        return unknown
    return []


def _is_collection(origin: Any) -> bool:
    if not isinstance(origin, type) or issubclass(origin, str):
        return False
    try:
        return issubclass(origin, Iterable)
    except TypeError:  # a Protocol with data members (openai's SequenceNotStr): a sequence
        return True


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) < 2_000 else text[:2_000] + "..."
