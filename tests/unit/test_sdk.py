"""The SDK without a gateway: the twins' surfaces are one, the messages and calls each method builds,
how replies and refusals are read, and where the URL and the key come from."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral import sdk
from corral.client import ActionFailed
from corral.errors import CorralError
from corral.sdk import AsyncGateway, AsyncSandbox, Gateway, GatewayError, Sandbox, calls, messages

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


# -- the gateway's HTTP API -------------------------------------------------------------------------------

Handler = Callable[[httpx.Request], httpx.Response]


def _gateways(handler: Handler) -> tuple[Gateway, AsyncGateway]:
    return (
        Gateway("http://gateway.test", "key-1", transport=httpx.MockTransport(handler)),
        AsyncGateway("http://gateway.test", "key-1", transport=httpx.MockTransport(handler)),
    )


SESSION = {"id": "ses_1", "token": "tok", "allow": ["example.test"], **INFO}


@pytest.mark.parametrize(
    ("use", "method", "path", "body"),
    [
        (lambda g: g.create_session({"allow": []}), "POST", "/v1/sessions", {"allow": []}),
        (lambda g: g.session("ses_1"), "GET", "/v1/sessions/ses_1", None),
        (lambda g: g.sessions(), "GET", "/v1/sessions", None),
        (
            lambda g: g.update_session("ses_1", ["a.test"], "report"),
            "PATCH",
            "/v1/sessions/ses_1",
            {"allow": ["a.test"], "egress_mode": "report"},
        ),
        (lambda g: g.update_session("ses_1", []), "PATCH", "/v1/sessions/ses_1", {"allow": []}),
        (
            lambda g: g.act("ses_1", {"action": {"type": "wait"}}),
            "POST",
            "/v1/sessions/ses_1/actions",
            {"action": {"type": "wait"}},
        ),
    ],
)
async def test_both_gateways_send_the_same_request(
    use: Callable[[Any], Any], method: str, path: str, body: dict[str, Any] | None
) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"ok": True, **SESSION})

    sync, twin = _gateways(handler)
    assert use(sync) == await use(twin)
    assert len(seen) == 2
    for request in seen:
        assert (request.method, request.url.path) == (method, path)
        assert request.headers["authorization"] == "Bearer key-1"
        assert (json.loads(request.content) if request.content else None) == body


async def test_traffic_reads_json_lines_with_its_filters() -> None:
    seen: list[httpx.Request] = []
    lines = '{"seq":1,"event":"proxy"}\n\n{"seq":2,"event":"request"}\n'

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, text=lines)

    sync, twin = _gateways(handler)
    expected = [{"seq": 1, "event": "proxy"}, {"seq": 2, "event": "request"}]
    assert sync.traffic("ses_1", host="a.test") == await twin.traffic("ses_1", host="a.test") == expected
    assert [(r.url.path, dict(r.url.params)) for r in seen] == [("/v1/sessions/ses_1/traffic", {"host": "a.test"})] * 2


@pytest.mark.parametrize(
    ("answer", "status", "code", "text"),
    [
        (
            {"json": {"error": {"code": "not_found", "message": "no session"}}},
            404,
            "not_found",
            "404 not_found: no session",
        ),
        ({"text": "boom"}, 500, "http_error", "500 http_error: boom"),
        ({"json": ["not", "an", "error"]}, 502, "http_error", '502 http_error: ["not","an","error"]'),
    ],
)
async def test_a_refusal_is_a_gateway_error(answer: dict[str, Any], status: int, code: str, text: str) -> None:
    sync, twin = _gateways(lambda request: httpx.Response(status, **answer))
    with pytest.raises(GatewayError) as sync_error:
        sync.session("ses_1")
    with pytest.raises(GatewayError) as async_error:
        await twin.session("ses_1")
    for error in (sync_error.value, async_error.value):
        assert (error.status, error.code, str(error)) == (status, code, text)
        assert isinstance(error, CorralError)


async def test_an_action_reply_is_returned_whatever_its_status_and_anything_else_is_refused() -> None:
    failure = httpx.Response(400, json=FAILED)
    assert calls.act("ses_1", {}).read(failure) == FAILED  # the sandbox's failure is a reply, not a refusal
    with pytest.raises(GatewayError, match="401 unauthorized"):
        calls.act("ses_1", {}).read(httpx.Response(401, json={"error": {"code": "unauthorized", "message": "no"}}))
    with pytest.raises(GatewayError, match="the gateway's answer is no reply: <html>"):
        calls.act("ses_1", {}).read(httpx.Response(200, text="<html>"))


def test_deleting_a_session_that_is_gone_can_be_fine() -> None:
    gone = httpx.Response(404, json={"error": {"code": "not_found", "message": "no session ses_1"}})
    assert calls.delete_session("ses_1", missing_ok=True).read(gone) is None
    with pytest.raises(GatewayError):
        calls.delete_session("ses_1").read(gone)
    assert calls.delete_upload("up_1").read(httpx.Response(500)) is None  # a clean-up never fails the caller


def test_session_body_has_only_what_was_given() -> None:
    assert sdk.session_body() == {"allow": [], "labels": {}}
    assert sdk.session_body(["a.test"], (800, 600), 60, 30, {"k": "v"}, "report", "up_1") == {
        "allow": ["a.test"],
        "labels": {"k": "v"},
        "viewport": {"width": 800, "height": 600},
        "timeout_s": 60,
        "idle_timeout_s": 30,
        "egress_mode": "report",
        "hermetic": "up_1",
    }


# -- where the gateway is, and the key ----------------------------------------------------------------------


def test_the_url_comes_from_the_argument_then_corral_url_then_corral_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CORRAL_URL", raising=False)
    monkeypatch.delenv("CORRAL_PORT", raising=False)
    assert sdk.gateway_url() == "http://127.0.0.1:8700"
    monkeypatch.setenv("CORRAL_PORT", "9000")
    assert sdk.gateway_url() == "http://127.0.0.1:9000"
    monkeypatch.setenv("CORRAL_URL", "http://gateway.test:1")
    assert sdk.gateway_url() == "http://gateway.test:1"
    assert sdk.gateway_url("http://other.test") == "http://other.test"


def test_the_key_comes_from_corral_api_key_then_what_is_stored(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CORRAL_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CORRAL_API_KEY", " , first ,second")
    assert sdk.api_key() == "first"  # the first of the list, as the gateway reads it
    monkeypatch.delenv("CORRAL_API_KEY")
    with pytest.raises(CorralError, match="no API key"):
        sdk.api_key()
    (tmp_path / "api_key").write_text("stored-key\n")
    assert sdk.api_key() == "stored-key"
    assert sdk.api_key(stored=lambda: "the compose gateway's") == "the compose gateway's"
    assert Gateway("http://gateway.test")._http.headers["authorization"] == "Bearer stored-key"
