"""The SDK without a gateway: the twins' surfaces are one (and the gateway clients'), the message each
method sends and how its reply is read, alike in both twins."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

from corral.errors import ActionFailed
from corral.gateway_client import AsyncGateway, Gateway
from corral.sdk import AsyncSandbox, Sandbox, messages

# -- the twins ------------------------------------------------------------------------------------------

# Context-manager dunders differ by name only; everything else public must match one to one.
_ASYNC_NAME = {"__enter__": "__aenter__", "__exit__": "__aexit__"}


def _surface(cls: type) -> dict[str, Any]:
    names = {n for n in vars(cls) if not n.startswith("_")} | {"__init__", *_ASYNC_NAME, *_ASYNC_NAME.values()}
    return {name: inspect.getattr_static(cls, name) for name in names if name in vars(cls)}


def _plain(annotation: Any) -> str:
    """An annotation (a string: the module has postponed annotations) with the twins' names made one."""
    text = str(annotation)
    for name in ("Sandbox", "Gateway", "BaseTransport"):
        text = text.replace(f"Async{name}", name)
    return text


def _signature(member: Any) -> tuple[Any, ...]:
    function = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
    signature = inspect.signature(function)
    parameters = tuple((p.name, p.kind, p.default, _plain(p.annotation)) for p in signature.parameters.values())
    return type(member).__name__, parameters, _plain(signature.return_annotation)


@pytest.mark.parametrize(("sync", "twin"), [(Sandbox, AsyncSandbox), (Gateway, AsyncGateway)])
def test_the_async_twin_has_the_same_public_surface(sync: type, twin: type) -> None:
    mine, theirs = _surface(sync), _surface(twin)
    assert {_ASYNC_NAME.get(name, name) for name in mine} == set(theirs)
    for name, member in mine.items():
        other = theirs[_ASYNC_NAME.get(name, name)]
        assert _signature(member) == _signature(other), name
        if callable(getattr(member, "__func__", member)) and name != "__init__":
            # Every call that does I/O is awaited in the twin (a property reads what is already there).
            function = getattr(other, "__func__", other)
            assert inspect.iscoroutinefunction(function), f"{twin.__name__}.{name} is not async"


def test_the_surface_comparison_sees_a_missing_method_and_a_changed_default() -> None:
    class Short(AsyncSandbox):
        async def key(self, keys: str, **envelope: Any) -> dict[str, Any]:  # no hold_ms, as AsyncSandbox once had
            raise NotImplementedError

    assert _signature(vars(Short)["key"]) != _signature(vars(Sandbox)["key"])
    assert set(_surface(Sandbox)) - {"__enter__", "__exit__"} > set(_surface(type("Empty", (), {})))


# -- the messages each method sends, and how the replies are read -----------------------------------------


class Recorder:
    """Stands in for the WebSocket client: keeps each message, answers with ``reply``."""

    def __init__(self, reply: dict[str, Any]) -> None:
        self.reply = reply
        self.sent: list[dict[str, Any]] = []

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        self.sent.append(message)
        return self.reply


class AsyncRecorder(Recorder):
    async def request(self, message: dict[str, Any]) -> dict[str, Any]:  # type: ignore[override]
        return super().request(message)


INFO = {"id": "ses_1", "ws_url": "ws://gateway.invalid/v1/sessions/ses_1/ws", "container": "corral-ses-1"}


def _sandbox(reply: dict[str, Any]) -> tuple[Sandbox, Recorder]:
    sandbox = Sandbox.__new__(Sandbox)  # no gateway, no WebSocket: only the message side is tested
    sandbox.info, sandbox.id = INFO, "ses_1"
    ws = Recorder(reply)
    sandbox._ws = ws  # type: ignore[assignment]
    return sandbox, ws


def _async_sandbox(reply: dict[str, Any]) -> tuple[AsyncSandbox, Recorder]:
    sandbox = AsyncSandbox.__new__(AsyncSandbox)
    sandbox.info, sandbox.id = INFO, "ses_1"
    ws = AsyncRecorder(reply)
    sandbox._ws = ws  # type: ignore[assignment]
    return sandbox, ws


# (method, args, kwargs, the message sent)
SENT: list[tuple[str, tuple[Any, ...], dict[str, Any], dict[str, Any]]] = [
    ("click", (), {}, {"action": {"type": "click", "button": "left", "count": 1, "modifiers": []}}),
    (
        "click",
        (10, 20),
        {"button": "middle", "count": 3, "modifiers": ["ctrl"], "screenshot": True},
        {
            "action": {"type": "click", "button": "middle", "count": 3, "modifiers": ["ctrl"], "x": 10, "y": 20},
            "screenshot": True,
        },
    ),
    (
        "double_click",
        (1, 2),
        {},
        {"action": {"type": "click", "button": "left", "count": 2, "modifiers": [], "x": 1, "y": 2}},
    ),
    ("right_click", (), {}, {"action": {"type": "click", "button": "right", "count": 1, "modifiers": []}}),
    ("mouse_down", (), {}, {"action": {"type": "mouse_down", "button": "left"}}),
    ("mouse_up", ("right",), {}, {"action": {"type": "mouse_up", "button": "right"}}),
    ("move", (3, 4), {}, {"action": {"type": "move", "x": 3, "y": 4}}),
    (
        "drag",
        ([(0, 0), (5, 6)],),
        {"wait_for": "stable"},
        {"action": {"type": "drag", "path": [{"x": 0, "y": 0}, {"x": 5, "y": 6}]}, "wait_for": "stable"},
    ),
    (
        "scroll",
        (),
        {"direction": "down", "clicks": 2},
        {"action": {"type": "scroll", "direction": "down", "clicks": 2}},
    ),
    ("scroll", (5, 6), {"dy": -40}, {"action": {"type": "scroll", "x": 5, "y": 6, "dy": -40}}),
    ("type", ("hi",), {}, {"action": {"type": "type", "text": "hi"}}),
    ("key", ("ctrl+a",), {}, {"action": {"type": "key", "keys": "ctrl+a"}}),
    ("key", ("shift",), {"hold_ms": 300}, {"action": {"type": "key", "keys": "shift", "hold_ms": 300}}),
    ("wait", (250,), {}, {"action": {"type": "wait", "ms": 250}}),
    (
        "navigate",
        ("https://example.test/",),
        {"wait_until": "commit"},
        {"action": {"type": "navigate", "url": "https://example.test/", "wait_until": "commit"}},
    ),
    ("back", (), {}, {"action": {"type": "back"}}),
    ("forward", (), {}, {"action": {"type": "forward"}}),
    ("reload", (), {}, {"action": {"type": "reload"}}),
    ("page_info", (), {}, {"action": {"type": "page_info"}}),
    ("tab_new", (), {}, {"action": {"type": "tab_new", "url": None}}),
    ("tab_switch", (1,), {}, {"action": {"type": "tab_switch", "tab": 1}}),
    ("tab_close", ("t2",), {}, {"action": {"type": "tab_close", "tab": "t2"}}),
    (
        "act",
        ({"type": "cursor_position"},),
        {"timeout_ms": 5},
        {"action": {"type": "cursor_position"}, "timeout_ms": 5},
    ),
    ("request", ({"openai": {"type": "wait"}},), {}, {"openai": {"type": "wait"}}),
]


@pytest.mark.parametrize(("method", "args", "kwargs", "message"), SENT)
async def test_both_twins_send_the_same_message(
    method: str, args: tuple[Any, ...], kwargs: dict[str, Any], message: dict[str, Any]
) -> None:
    reply = {"ok": True, "id": 1, "result": {"x": 1, "y": 2}}
    sandbox, ws = _sandbox(reply)
    twin, twin_ws = _async_sandbox(reply)
    assert getattr(sandbox, method)(*args, **kwargs) == await getattr(twin, method)(*args, **kwargs)
    assert ws.sent == twin_ws.sent == [message]


IMAGE = {"ok": True, "id": 1, "result": {}, "screenshot": {"data": "iVBORw=="}}


@pytest.mark.parametrize(
    ("call", "reply", "message", "value"),
    [
        (
            lambda s: s.screenshot("jpeg", quality=50),
            IMAGE,
            {"action": {"type": "screenshot", "format": "jpeg", "quality": 50}},
            b"\x89PNG",
        ),
        (
            lambda s: s.zoom(1, 2, 30, 40, format="jpeg"),
            IMAGE,
            {"action": {"type": "zoom", "region": {"x": 1, "y": 2, "width": 30, "height": 40}, "format": "jpeg"}},
            b"\x89PNG",
        ),
        (
            lambda s: s.cursor_position(),
            {"ok": True, "result": {"x": 7, "y": 8}},
            {"action": {"type": "cursor_position"}},
            (7, 8),
        ),
        (
            lambda s: s.tabs(),
            {"ok": True, "result": {"tabs": [{"id": "t1"}]}},
            {"action": {"type": "tabs"}},
            [{"id": "t1"}],
        ),
        (
            lambda s: s.clipboard_get(),
            {"ok": True, "result": {"text": "copied"}},
            {"action": {"type": "clipboard_get"}},
            "copied",
        ),
        (
            lambda s: s.clipboard_set("x"),
            {"ok": True, "result": {}},
            {"action": {"type": "clipboard_set", "text": "x"}},
            None,
        ),
        (
            lambda s: s.run_anthropic({"action": "screenshot"}, display=(1024, 640)),
            {"ok": True, "result": {"tool_result_content": [{"type": "image"}]}},
            {"anthropic": {"action": "screenshot"}, "display": {"width": 1024, "height": 640}},
            [{"type": "image"}],
        ),
        (
            lambda s: s.run_openai([{"type": "wait"}]),
            {"ok": True, "result": {"output": {"type": "computer_screenshot"}}},
            {"openai": [{"type": "wait"}]},
            {"type": "computer_screenshot"},
        ),
    ],
)
async def test_replies_are_read_the_same_by_both_twins(
    call: Callable[[Any], Any], reply: dict[str, Any], message: dict[str, Any], value: Any
) -> None:
    sandbox, ws = _sandbox(reply)
    twin, twin_ws = _async_sandbox(reply)
    assert call(sandbox) == await call(twin) == value
    assert ws.sent == twin_ws.sent == [message]


FAILED = {"ok": False, "id": 1, "error": {"code": "out_of_bounds", "message": "off the screen", "field": "action.x"}}


@pytest.mark.parametrize("method", ["click", "page_info", "screenshot", "clipboard_get", "tabs", "cursor_position"])
async def test_a_failure_reply_raises_action_failed_in_both_twins(method: str) -> None:
    sandbox, _ = _sandbox(FAILED)
    twin, _ = _async_sandbox(FAILED)
    with pytest.raises(ActionFailed) as sync_failure:
        getattr(sandbox, method)()
    with pytest.raises(ActionFailed) as async_failure:
        await getattr(twin, method)()
    for failure in (sync_failure.value, async_failure.value):
        assert (failure.code, failure.field) == ("out_of_bounds", "action.x")
        assert str(failure) == "out_of_bounds: off the screen (field action.x)"


async def test_request_returns_a_failure_as_it_came() -> None:
    sandbox, _ = _sandbox(FAILED)
    twin, _ = _async_sandbox(FAILED)
    assert sandbox.request({"action": {"type": "click"}}) == await twin.request({"action": {"type": "click"}}) == FAILED


def test_messages_are_values() -> None:
    message = messages.key("Return", None, {"screenshot": True})
    assert message.body == {"action": {"type": "key", "keys": "Return"}, "screenshot": True}
    assert message.read({"ok": True, "result": {}}) == {"ok": True, "result": {}}
    with pytest.raises(ActionFailed):
        message.read(FAILED)
