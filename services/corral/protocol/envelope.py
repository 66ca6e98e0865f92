"""A client message (JSON text) to a :class:`~corral.protocol.plan.Plan`, or a structured error."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from corral.errors import ActionError, ErrorCode
from corral.protocol import actions as a
from corral.protocol.geometry import Scale, Size, check_bounds
from corral.protocol.plan import After, Dialect, Plan, RequestId, Step
from corral.protocol.validation import validate
from corral.protocol.vendor.calls import call_of


@dataclass(frozen=True, slots=True)
class Limits:
    """Server-side defaults and caps; these defaults are the controller's settings' (corral.sandbox.settings)."""

    max_message_bytes: int = 1 << 20
    timeout_ms: int = 60_000
    max_timeout_ms: int = 600_000
    settle_timeout_ms: int = 3_000
    settle_quiet_ms: int = 120
    settle_min_ms: int = 300


class DisplaySize(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    width: Annotated[int, Field(ge=16, le=16_384)]
    height: Annotated[int, Field(ge=16, le=16_384)]


class Envelope(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Annotated[str, Field(max_length=256)] | int | None = None
    action: Any = None
    anthropic: Any = None
    openai: Any = None
    screenshot: bool | a.ScreenshotOptions | None = None
    wait_for: Literal["stable", "none"] | None = None
    settle_timeout_ms: Annotated[int, Field(ge=0, le=30_000)] | None = None
    settle_quiet_ms: Annotated[int, Field(ge=10, le=5_000)] | None = None
    settle_min_ms: Annotated[int, Field(ge=0, le=10_000)] | None = None
    timeout_ms: Annotated[int, Field(ge=1)] | None = None
    display: DisplaySize | None = None
    acknowledge_safety_checks: bool = False  # a computer_call's output acknowledges its pending safety checks
    # While a human (or an exclusive CDP client) holds the control lease: wait this long for it to be
    # handed back before failing with control_taken (corral.sandbox.control.lease).
    wait_for_control_ms: Annotated[int, Field(ge=0, le=a.MAX_CONTROL_WAIT_MS)] = 0


_ENVELOPE = TypeAdapter(Envelope)
_PAYLOADS = ("action", "anthropic", "openai")


def decode(raw: str | bytes, limits: Limits) -> dict[str, Any]:
    """Parse one message's JSON text; it must be an object within the size limit."""
    size = len(raw.encode() if isinstance(raw, str) else raw)
    if size > limits.max_message_bytes:
        raise ActionError(ErrorCode.MESSAGE_TOO_LARGE, f"message is {size} bytes; at most {limits.max_message_bytes}")
    try:
        obj = json.loads(raw, parse_constant=_no_constant, parse_float=_finite)
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise ActionError(ErrorCode.INVALID_JSON, f"message is not valid JSON: {exc}") from None
    except RecursionError:
        raise ActionError(ErrorCode.INVALID_JSON, f"message nests deeper than {MAX_DEPTH} levels") from None
    if nesting(obj) > MAX_DEPTH:
        # What parses may still be too deep for what comes after (validation, the recorder's dump).
        raise ActionError(ErrorCode.INVALID_JSON, f"message nests deeper than {MAX_DEPTH} levels")
    if not isinstance(obj, dict):
        raise ActionError(ErrorCode.INVALID_REQUEST, "message must be a JSON object")
    return obj


def _no_constant(name: str) -> Any:
    # Python's json reads NaN and Infinity, which JSON has not: nothing downstream could write them back.
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):  # 1e999 reads as inf
        raise ValueError(f"{text} is out of range for a number")
    return number


MAX_DEPTH = 32  # no action nests deeper than 5; room for clients' own ids and labels


def nesting(value: Any) -> int:
    """How deep arrays and objects nest in a parsed JSON value (iterative: no recursion to exhaust)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            depth += 1
            if depth > MAX_DEPTH:
                return depth
            deepest = max(deepest, depth)
            stack.extend((child, depth) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def request_id_of(obj: dict[str, Any]) -> RequestId:
    """The client's id if it is a usable one, so even a rejected message's reply can be matched."""
    value = obj.get("id")
    if isinstance(value, bool):
        return None
    if isinstance(value, int) or (isinstance(value, str) and len(value) <= 256 and _encodable(value)):
        return value
    return None


def _encodable(text: str) -> bool:
    """False for lone surrogates, which JSON parsing lets through but no reply can encode."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


# The dialects and the vendors' tools are imported where a request first speaks them: a session
# whose client speaks native actions never builds their models (docs/design/0470).


def _vendor_form(env: Envelope, dialect: Dialect) -> bool:
    """A whole tool_use block or output item, rather than today's computer input, action or batch."""
    from corral.protocol import vendor

    if dialect is Dialect.ANTHROPIC:
        return vendor.is_block(env.anthropic)
    return dialect is Dialect.OPENAI and vendor.is_item(env.openai)


def _steps(env: Envelope, dialect: Dialect, display: Size) -> list[Step]:
    if dialect is Dialect.NATIVE:
        return [Step(validate(a.native_action(), env.action, "action", tagged=True), "action")]
    from corral.protocol import anthropic, openai, vendor

    if _vendor_form(env, dialect):
        return vendor.translate(dialect.value, getattr(env, dialect.value), display)
    if dialect is Dialect.ANTHROPIC:
        return [Step(action, "anthropic") for action in anthropic.translate(env.anthropic, "anthropic")]
    return [Step(action, field) for action, field in openai.translate(env.openai, "openai")]


def _default_screenshot(env: Envelope, dialect: Dialect) -> bool:
    if dialect is Dialect.NATIVE:
        return False
    from corral.protocol import anthropic, vendor

    if _vendor_form(env, dialect):
        return vendor.default_screenshot(dialect.value, getattr(env, dialect.value))
    if dialect is Dialect.ANTHROPIC:
        action = env.anthropic.get("action") if isinstance(env.anthropic, dict) else None
        return anthropic.wants_screenshot(str(action))
    return dialect is Dialect.OPENAI


# An encoded image may have at most this many times the screen's pixels (a zoom may enlarge).
MAX_OUTPUT_SCREENS = 4


def _output_size(region: a.Region | None, width: int | None, scale: float | None, screen: Size) -> int:
    w, h = (region.width, region.height) if region is not None else (screen.width, screen.height)
    if width is not None:
        return width * max(1, round(h * width / w))
    if scale is not None:
        return round(w * scale) * round(h * scale)
    return w * h


def _check_output_size(action: object, screen: Size, field: str) -> None:
    if isinstance(action, a.ScreenshotOptions | a.Zoom):
        scale = action.scale if isinstance(action, a.ScreenshotOptions) else None
        pixels = _output_size(action.region, action.width, scale, screen)
        if pixels > MAX_OUTPUT_SCREENS * screen.width * screen.height:
            raise ActionError(
                ErrorCode.INVALID_FIELD,
                f"the image would have {pixels} pixels; at most {MAX_OUTPUT_SCREENS}x the screen's",
                field=f"{field}.width",
            )


def _dialect(env: Envelope) -> Dialect:
    given = [name for name in _PAYLOADS if getattr(env, name) is not None]
    if len(given) != 1:
        raise ActionError(
            ErrorCode.INVALID_REQUEST,
            "a message holds exactly one of 'action', 'anthropic' or 'openai'"
            + (f" (got {', '.join(given)})" if given else ""),
        )
    return Dialect(given[0])


def _planned_steps(env: Envelope, dialect: Dialect, display: Size, scale: Scale | None) -> list[Step]:
    """The request's native steps, checked against the display and mapped to the screen."""
    steps: list[Step] = []
    for step in _steps(env, dialect, display):
        try:
            check_bounds(step.action, display, step.field)
        except ActionError as exc:
            if dialect is Dialect.ANTHROPIC:
                from corral.protocol import anthropic

                anthropic.blame_source(exc, step.field)
            raise
        action = step.action if scale is None else step.action.map_points(scale)
        if scale is not None and isinstance(action, a.Screenshot) and action.scale is None and action.width is None:
            # The image comes back in display pixels: the whole display, or the region's display width.
            region = step.action.region if isinstance(step.action, a.Screenshot) else None
            action = action.model_copy(update={"width": display.width if region is None else region.width})
        steps.append(Step(action, step.field))
    return steps


def _screenshot_options(
    env: Envelope, dialect: Dialect, steps: list[Step], display: Size, scale: Scale | None
) -> a.ScreenshotOptions | None:
    """The screenshot taken after the steps (None: not asked for, or the last step took one)."""
    want = env.screenshot if env.screenshot is not None else _default_screenshot(env, dialect)
    if want is False or any(isinstance(s.action, a.Screenshot | a.Zoom) for s in steps[-1:]):
        return None
    options = want if isinstance(want, a.ScreenshotOptions) else a.ScreenshotOptions()
    if scale is not None:
        region = options.region
        if region is not None:
            check_bounds(a.Screenshot(type="screenshot", region=region), display, "screenshot")
            options = options.model_copy(update={"region": region.mapped(scale)})
        if options.scale is None and options.width is None:
            options = options.model_copy(update={"width": display.width if region is None else region.width})
    elif options.region is not None:
        check_bounds(a.Screenshot(type="screenshot", region=options.region), display, "screenshot")
    return options


def plan_request(obj: dict[str, Any], screen: Size, limits: Limits) -> Plan:
    """Validate a decoded message against the screen and turn it into a :class:`Plan`."""
    env = validate(_ENVELOPE, obj, "")
    dialect = _dialect(env)
    timeout_ms = env.timeout_ms or limits.timeout_ms
    if timeout_ms > limits.max_timeout_ms:
        raise ActionError(ErrorCode.INVALID_FIELD, f"timeout_ms is at most {limits.max_timeout_ms}", field="timeout_ms")

    display = Size(env.display.width, env.display.height) if env.display else screen
    scale = None if display == screen else Scale(screen=screen, display=display)
    call = call_of(obj) if _vendor_form(env, dialect) else None
    if call is not None and call.tool == "computer_call" and env.screenshot is False:
        # Its only output is the screen: a success without one would leave nothing to send back.
        raise ActionError(
            ErrorCode.INVALID_FIELD,
            "a computer_call_output is the screen: leave screenshot out, or give options",
            field="screenshot",
        )
    steps = _planned_steps(env, dialect, display, scale)
    for step in steps:
        _check_output_size(step.action, screen, step.field)
    options = _screenshot_options(env, dialect, steps, display, scale)
    if options is not None:
        _check_output_size(options, screen, "screenshot")
    # Dialect calls settle by default; a bare screenshot or a cursor query has nothing to wait for.
    passive = isinstance(steps[-1].action, a.Screenshot | a.Zoom | a.CursorPosition) or (
        call is not None and not call.computer  # a shell, editor or file tool
    )
    stable = env.wait_for == "stable" if env.wait_for is not None else dialect is not Dialect.NATIVE and not passive
    after = After(
        screenshot=options,
        wait_for_stable=stable,
        settle_timeout_ms=limits.settle_timeout_ms if env.settle_timeout_ms is None else env.settle_timeout_ms,
        settle_quiet_ms=env.settle_quiet_ms or limits.settle_quiet_ms,
        settle_min_ms=limits.settle_min_ms if env.settle_min_ms is None else env.settle_min_ms,
    )
    return Plan(
        env.id,
        dialect,
        tuple(steps),
        after,
        timeout_ms,
        scale=scale,
        call=call,
        wait_for_control_ms=env.wait_for_control_ms,
    )
