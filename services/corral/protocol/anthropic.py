"""Anthropic's computer tool (computer_20250124, computer_20251124) to and from native actions.

The request carries the tool's ``input`` verbatim; the reply's ``result.tool_result_content``
is the list of content blocks to put in the ``tool_result``.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from corral.errors import ActionError, ErrorCode
from corral.protocol import actions as a
from corral.protocol.geometry import Scale
from corral.protocol.plan import ActionResult, EncodedImage
from corral.protocol.validation import validate

AnthropicActionName = Literal[
    "key",
    "type",
    "mouse_move",
    "left_click",
    "left_click_drag",
    "right_click",
    "middle_click",
    "double_click",
    "triple_click",
    "left_mouse_down",
    "left_mouse_up",
    "scroll",
    "hold_key",
    "wait",
    "cursor_position",
    "screenshot",
    "zoom",
]
_Pair = tuple[int, int]


class AnthropicInput(BaseModel):
    """The computer tool's input, as the model sends it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    action: AnthropicActionName
    coordinate: _Pair | None = None
    start_coordinate: _Pair | None = None
    text: str | None = None
    key: str | None = None
    scroll_direction: Literal["up", "down", "left", "right"] | None = None
    scroll_amount: Annotated[int, Field(ge=0, le=200)] | None = None
    duration: Annotated[float, Field(ge=0, le=100)] | None = None
    region: tuple[int, int, int, int] | None = None


_INPUT = TypeAdapter(AnthropicInput)

_CLICKS: dict[str, tuple[a.Button, int]] = {
    "left_click": ("left", 1),
    "right_click": ("right", 1),
    "middle_click": ("middle", 1),
    "double_click": ("left", 2),
    "triple_click": ("left", 3),
}


def _need(value: Any, name: str, field: str, action: str) -> Any:
    if value is None:
        raise ActionError(ErrorCode.MISSING_FIELD, f"{action!r} needs {name!r}", field=f"{field}.{name}")
    return value


# Native field -> the computer-tool field it came from, so errors name what the model sent.
_SOURCE_FIELD = {
    "modifiers": "text",
    "x": "coordinate",
    "y": "coordinate",
    "path": "coordinate",
    "keys": "text",
    "ms": "duration",
    "hold_ms": "duration",
    "clicks": "scroll_amount",
    "direction": "scroll_direction",
}


def blame_source(exc: ActionError, field: str, held: str = "text") -> None:
    """Point ``exc.field`` (a native path under ``field``) at the computer-tool field it came from.

    ``held`` is the field the modifiers were given in (``text`` or ``key``).
    """
    if exc.field is None or not exc.field.startswith(field + "."):
        return
    rest = exc.field[len(field) + 1 :]
    leaf = rest.split("[")[0].split(".")[0]
    if leaf == "path":
        source = "start_coordinate" if rest.startswith("path[0]") else "coordinate"
    elif leaf == "modifiers":
        source = held
    else:
        source = _SOURCE_FIELD.get(leaf, leaf)
    exc.field = f"{field}.{source}"


def _native(data: dict[str, Any], field: str, held: str = "text") -> a.NativeAction:
    try:
        return validate(a.native_action(), data, field, tagged=True)
    except ActionError as exc:
        blame_source(exc, field, held)
        raise


def _held_field(inp: AnthropicInput) -> str:
    return "text" if inp.text is not None else "key"


def _modifiers(inp: AnthropicInput) -> list[str]:
    held = inp.text if inp.text is not None else inp.key
    return [part for part in held.split("+") if part] if held else []


def _xy(pair: _Pair | None) -> dict[str, int]:
    return {} if pair is None else {"x": pair[0], "y": pair[1]}


def translate(raw: Any, field: str) -> list[a.NativeAction]:
    """The native actions (in display coordinates) for one computer-tool input."""
    inp = validate(_INPUT, raw, field)
    name = inp.action
    if name in _CLICKS:
        button, count = _CLICKS[name]
        data = {"type": "click", "button": button, "count": count, "modifiers": _modifiers(inp), **_xy(inp.coordinate)}
        return [_native(data, field, _held_field(inp))]
    if name == "mouse_move":
        return [_native({"type": "move", **_xy(_need(inp.coordinate, "coordinate", field, name))}, field)]
    if name == "left_click_drag":
        start = _need(inp.start_coordinate, "start_coordinate", field, name)
        end = _need(inp.coordinate, "coordinate", field, name)
        path = [{"x": start[0], "y": start[1]}, {"x": end[0], "y": end[1]}]
        return [_native({"type": "drag", "path": path, "modifiers": _modifiers(inp)}, field, _held_field(inp))]
    if name in ("left_mouse_down", "left_mouse_up"):
        kind = "mouse_down" if name == "left_mouse_down" else "mouse_up"
        return [_native({"type": kind, "button": "left", **_xy(inp.coordinate)}, field)]
    if name == "type":
        return [_native({"type": "type", "text": _need(inp.text, "text", field, name)}, field)]
    if name == "key":
        return [_native({"type": "key", "keys": _need(inp.text, "text", field, name)}, field)]
    if name == "hold_key":
        seconds = _need(inp.duration, "duration", field, name)
        keys = _need(inp.text, "text", field, name)
        return [_native({"type": "key", "keys": keys, "hold_ms": round(seconds * 1000)}, field)]
    if name == "scroll":
        direction = _need(inp.scroll_direction, "scroll_direction", field, name)
        amount = _need(inp.scroll_amount, "scroll_amount", field, name)
        if amount == 0:
            return [_native({"type": "wait", "ms": 0}, field)]
        data = {
            "type": "scroll",
            "direction": direction,
            "clicks": amount,
            "modifiers": _modifiers(inp),
            **_xy(inp.coordinate),
        }
        return [_native(data, field, _held_field(inp))]
    if name == "wait":
        seconds = _need(inp.duration, "duration", field, name)
        return [_native({"type": "wait", "ms": round(seconds * 1000)}, field)]
    if name == "cursor_position":
        return [_native({"type": "cursor_position"}, field)]
    if name == "zoom":
        x1, y1, x2, y2 = _need(inp.region, "region", field, name)
        if x2 <= x1 or y2 <= y1:
            raise ActionError(
                ErrorCode.INVALID_FIELD, "region is [x1, y1, x2, y2] with x2 > x1 and y2 > y1", field=f"{field}.region"
            )
        region = {"x": x1, "y": y1, "width": x2 - x1, "height": y2 - y1}
        return [_native({"type": "zoom", "region": region}, field)]
    return [_native({"type": "screenshot"}, field)]


def wants_screenshot(raw_action: str) -> bool:
    """Whether this action's tool_result carries a screenshot by default."""
    return raw_action != "cursor_position"


class TextBlock(TypedDict):
    type: Literal["text"]
    text: str


class ImageSource(TypedDict):
    type: Literal["base64"]
    media_type: str
    data: str


class ImageBlock(TypedDict):
    type: Literal["image"]
    source: ImageSource


ContentBlock = TextBlock | ImageBlock  # of a tool_result (BetaToolResultBlockParam's content)


def image_block(image: EncodedImage) -> ImageBlock:
    data = base64.b64encode(image.data).decode()
    return {"type": "image", "source": {"type": "base64", "media_type": image.media_type, "data": data}}


def tool_result_content(
    last_action: a.NativeAction, last: ActionResult, image: EncodedImage | None, scale: Scale | None
) -> list[ContentBlock]:
    """The content blocks of the tool_result for one computer-tool call."""
    blocks: list[ContentBlock] = []
    if isinstance(last_action, a.CursorPosition):
        x, y = last.data["x"], last.data["y"]
        if scale is not None:
            x, y = scale.to_display(x, y)
        blocks.append({"type": "text", "text": f"X={x},Y={y}"})
    if image is not None:
        blocks.append(image_block(image))
    return blocks
