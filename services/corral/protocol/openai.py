"""OpenAI's computer-use actions (one action, or a batch ``actions[]``) to and from native actions.

The reply's ``result.output`` is the ``computer_call_output.output`` object: a
``computer_screenshot`` with the screen as a data URL.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from corral.errors import ActionError, ErrorCode, UnknownKeyError
from corral.protocol import actions as a
from corral.protocol import keys as keyparse
from corral.protocol.plan import EncodedImage
from corral.protocol.validation import validate

MAX_BATCH = 100
DEFAULT_WAIT_MS = 1_000

_Keys = Annotated[list[Annotated[str, Field(min_length=1, max_length=64)]], Field(max_length=16)]


class _OpenAIAction(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Point(_OpenAIAction):
    x: int
    y: int


class OAClick(_OpenAIAction):
    type: Literal["click"]
    button: Literal["left", "right", "wheel", "back", "forward"] = "left"
    x: int
    y: int
    keys: _Keys | None = None


class OADoubleClick(_OpenAIAction):
    type: Literal["double_click"]
    x: int
    y: int
    keys: _Keys | None = None


class OADrag(_OpenAIAction):
    type: Literal["drag"]
    path: Annotated[list[_Point], Field(min_length=2, max_length=a.MAX_PATH_POINTS)]
    keys: _Keys | None = None


class OAKeypress(_OpenAIAction):
    type: Literal["keypress"]
    keys: Annotated[list[Annotated[str, Field(min_length=1, max_length=64)]], Field(min_length=1, max_length=16)]


class OAMove(_OpenAIAction):
    type: Literal["move"]
    x: int
    y: int
    keys: _Keys | None = None


class OAScroll(_OpenAIAction):
    type: Literal["scroll"]
    x: int
    y: int
    scroll_x: int = 0
    scroll_y: int = 0
    keys: _Keys | None = None


class OAType(_OpenAIAction):
    type: Literal["type"]
    text: str


class OAWait(_OpenAIAction):
    type: Literal["wait"]
    ms: Annotated[int, Field(ge=0, le=a.MAX_WAIT_MS)] | None = None


class OAScreenshot(_OpenAIAction):
    type: Literal["screenshot"]


OpenAIAction = Annotated[
    OAClick | OADoubleClick | OADrag | OAKeypress | OAMove | OAScroll | OAType | OAWait | OAScreenshot,
    Field(discriminator="type"),
]
_INPUT: TypeAdapter[OpenAIAction] = TypeAdapter(OpenAIAction)
_BUTTONS: dict[str, a.Button] = {
    "left": "left",
    "right": "right",
    "wheel": "middle",
    "back": "back",
    "forward": "forward",
}


def _key_name(name: str, field: str) -> str:
    """An OpenAI key name (``CTRL``, ``ENTER``, ``A``) as a keysym name; letters are not shifted."""
    token = name.lower() if len(name) == 1 and name.isalpha() else name
    try:
        key = keyparse.parse_key(token)
    except UnknownKeyError as exc:
        raise ActionError(ErrorCode.UNKNOWN_KEY, str(exc), field=field) from None
    # The names are joined with '+' into a combo, where a bare '+' would be taken for a separator.
    return "plus" if key.name == "+" else key.name


def _modifiers(keys: list[str] | None, field: str) -> list[str]:
    names = [_key_name(k, f"{field}.keys[{i}]") for i, k in enumerate(keys or [])]
    for index, name in enumerate(names):
        if not keyparse.parse_key(name).is_modifier:
            raise ActionError(ErrorCode.UNKNOWN_KEY, f"{name!r} is not a modifier key", field=f"{field}.keys[{index}]")
    return names


def _native(data: dict[str, Any], field: str) -> a.NativeAction:
    return validate(a.native_action(), data, field, tagged=True)


def translate_one(raw: Any, field: str) -> a.NativeAction:
    """The native action (in display coordinates) for one OpenAI action."""
    act = validate(_INPUT, raw, field, tagged=True)
    if isinstance(act, OAClick):
        data = {
            "type": "click",
            "button": _BUTTONS[act.button],
            "x": act.x,
            "y": act.y,
            "modifiers": _modifiers(act.keys, field),
        }
        return _native(data, field)
    if isinstance(act, OADoubleClick):
        data = {"type": "click", "count": 2, "x": act.x, "y": act.y, "modifiers": _modifiers(act.keys, field)}
        return _native(data, field)
    if isinstance(act, OADrag):
        path = [{"x": p.x, "y": p.y} for p in act.path]
        return _native({"type": "drag", "path": path, "modifiers": _modifiers(act.keys, field)}, field)
    if isinstance(act, OAKeypress):
        combo = "+".join(_key_name(k, f"{field}.keys[{i}]") for i, k in enumerate(act.keys))
        return _native({"type": "key", "keys": combo}, field)
    if isinstance(act, OAMove):
        return _native({"type": "move", "x": act.x, "y": act.y, "modifiers": _modifiers(act.keys, field)}, field)
    if isinstance(act, OAScroll):
        if act.scroll_x == 0 and act.scroll_y == 0:
            return _native({"type": "move", "x": act.x, "y": act.y}, field)
        data = {
            "type": "scroll",
            "x": act.x,
            "y": act.y,
            "dx": act.scroll_x,
            "dy": act.scroll_y,
            "modifiers": _modifiers(act.keys, field),
        }
        return _native(data, field)
    if isinstance(act, OAType):
        return _native({"type": "type", "text": act.text}, field)
    if isinstance(act, OAWait):
        return _native({"type": "wait", "ms": DEFAULT_WAIT_MS if act.ms is None else act.ms}, field)
    return _native({"type": "screenshot"}, field)


def translate(raw: Any, field: str) -> list[tuple[a.NativeAction, str]]:
    """One action or a batch, each with the request field it came from."""
    if isinstance(raw, list):
        if not raw:
            raise ActionError(ErrorCode.INVALID_REQUEST, "the batch of actions is empty", field=field)
        if len(raw) > MAX_BATCH:
            raise ActionError(ErrorCode.INVALID_REQUEST, f"at most {MAX_BATCH} actions per batch", field=field)
        return [(translate_one(item, f"{field}[{i}]"), f"{field}[{i}]") for i, item in enumerate(raw)]
    return [(translate_one(raw, field), field)]


def call_output(image: EncodedImage) -> dict[str, str]:
    """``computer_call_output.output`` for a screenshot."""
    data = base64.b64encode(image.data).decode()
    return {"type": "computer_screenshot", "image_url": f"data:{image.media_type};base64,{data}"}
