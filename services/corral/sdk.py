"""The Corral SDK: create a session through the gateway and drive it.

    from corral import Sandbox
    with Sandbox.create(allow=["example.com"]) as sb:
        sb.navigate("https://example.com")
        sb.click(100, 200)
        png = sb.screenshot()

``AsyncSandbox`` is the same with ``async``/``await``: the same methods with the same parameters
(a unit test holds them to it). ``run_anthropic`` and ``run_openai`` return exactly what to send back
to each model API.

Every method is one line in each twin: a pure function of this module builds the request (a
:class:`Message` to the sandbox, a :class:`Call` to the gateway's HTTP API) and says how its reply is
read; the twins only send it, blocking or awaited. :class:`Gateway` and :class:`AsyncGateway` are the
HTTP API on its own (the CLI's client); :func:`gateway_url` and :func:`api_key` are where the client
side reads ``CORRAL_URL``, ``CORRAL_PORT`` and ``CORRAL_API_KEY``.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import httpx

from corral.client import ActionFailed, AsyncSandboxClient, SandboxClient, check_reply, image_bytes
from corral.errors import CorralError

T = TypeVar("T")

DEFAULT_PORT = 8700
DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"
TIMEOUT_S = 120


class GatewayError(CorralError):
    """The gateway refused a request; ``status`` and ``code`` say why."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        error = body.get("error") or {}
        super().__init__(f"{status} {error.get('code')}: {error.get('message')}")
        self.status = status
        self.code: str = error.get("code", "")


# -- where the gateway is, and the key ------------------------------------------------------------------


def gateway_url(url: str | None = None) -> str:
    """``url``, else ``$CORRAL_URL``, else 127.0.0.1 on ``$CORRAL_PORT`` (8700)."""
    return url or os.environ.get("CORRAL_URL") or f"http://127.0.0.1:{os.environ.get('CORRAL_PORT') or DEFAULT_PORT}"


def _data_dir_key() -> str | None:
    """The key a gateway on this host generated and kept (``$CORRAL_DATA_DIR/api_key``)."""
    data_dir = Path(os.environ.get("CORRAL_DATA_DIR") or Path.home() / ".local" / "share" / "corral")
    path = data_dir / "api_key"
    return path.read_text().strip() if path.is_file() else None


def api_key(stored: Callable[[], str | None] = _data_dir_key) -> str:
    """The first key of ``$CORRAL_API_KEY`` (comma-separated, as the gateway reads it), else the one
    ``stored`` finds (by default the data dir's; the CLI reads the compose gateway's)."""
    keys = [key.strip() for key in os.environ.get("CORRAL_API_KEY", "").split(",") if key.strip()]
    key = keys[0] if keys else stored()
    if not key:
        raise CorralError("no API key: set CORRAL_API_KEY (see `corral status`)")
    return key


# -- the gateway's HTTP API: requests and how their answers are read (pure) -----------------------------


def _checked(response: httpx.Response) -> httpx.Response:
    if response.status_code >= 400:
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            body = {"error": {"code": "http_error", "message": response.text[:200]}}
        raise GatewayError(response.status_code, body)
    return response


def _json(response: httpx.Response) -> Any:
    return None if _checked(response).status_code == 204 else response.json()


def _nothing(response: httpx.Response) -> None:
    _checked(response)


def _ignored(response: httpx.Response) -> None:
    """A clean-up whose failure changes nothing for the caller."""


def _records(response: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line) for line in _checked(response).text.splitlines() if line.strip()]


def _reply(response: httpx.Response) -> dict[str, Any]:
    """A sandbox's reply relayed over HTTP (``ok`` true or false), or the gateway's own refusal."""
    try:
        reply = response.json()
    except ValueError:
        reply = None
    if isinstance(reply, dict) and "ok" in reply:
        return reply
    _checked(response)  # the gateway's refusal (401, 404, 502, ...)
    message = f"the gateway's answer is no reply: {response.text[:200]}"
    raise GatewayError(response.status_code, {"error": {"code": "no_reply", "message": message}})


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request to the gateway's HTTP API and how its answer is read."""

    method: str
    path: str
    read: Callable[[httpx.Response], T]
    json: Any = None
    content: bytes | None = None
    params: dict[str, str] | None = None

    def options(self) -> dict[str, Any]:
        return {"json": self.json, "content": self.content, "params": self.params}


def session_body(
    allow: Sequence[str] | None = None,
    viewport: tuple[int, int] | None = None,
    timeout_s: int | None = None,
    idle_timeout_s: int | None = None,
    labels: dict[str, str] | None = None,
    egress_mode: str | None = None,
    hermetic: str | None = None,
) -> dict[str, Any]:
    """The body of ``POST /v1/sessions``: what was given, nothing else (the gateway has the defaults)."""
    body: dict[str, Any] = {"allow": list(allow or []), "labels": dict(labels or {})}
    if egress_mode is not None:
        body["egress_mode"] = egress_mode
    if hermetic is not None:
        body["hermetic"] = hermetic
    if viewport is not None:
        body["viewport"] = {"width": viewport[0], "height": viewport[1]}
    if timeout_s is not None:
        body["timeout_s"] = timeout_s
    if idle_timeout_s is not None:
        body["idle_timeout_s"] = idle_timeout_s
    return body


def _missing_ok(response: httpx.Response) -> None:
    if response.status_code != 404:
        _checked(response)


class calls:  # a namespace of pure builders, read as calls.create_session(...)
    """Every request of the gateway's API, built without sending it."""

    @staticmethod
    def create_session(body: dict[str, Any]) -> Call[dict[str, Any]]:
        return Call("POST", "/v1/sessions", _json, json=body)

    @staticmethod
    def session(session_id: str) -> Call[dict[str, Any]]:
        return Call("GET", f"/v1/sessions/{session_id}", _json)

    @staticmethod
    def sessions() -> Call[list[dict[str, Any]]]:
        return Call("GET", "/v1/sessions", _json)

    @staticmethod
    def update_session(session_id: str, allow: Sequence[str], egress_mode: str | None = None) -> Call[dict[str, Any]]:
        body: dict[str, Any] = {"allow": list(allow)}
        if egress_mode is not None:
            body["egress_mode"] = egress_mode
        return Call("PATCH", f"/v1/sessions/{session_id}", _json, json=body)

    @staticmethod
    def delete_session(session_id: str, missing_ok: bool = False) -> Call[None]:
        return Call("DELETE", f"/v1/sessions/{session_id}", _missing_ok if missing_ok else _nothing)

    @staticmethod
    def act(session_id: str, message: dict[str, Any]) -> Call[dict[str, Any]]:
        return Call("POST", f"/v1/sessions/{session_id}/actions", _reply, json=message)

    @staticmethod
    def traffic(session_id: str, filters: dict[str, str]) -> Call[list[dict[str, Any]]]:
        return Call("GET", f"/v1/sessions/{session_id}/traffic", _records, params=filters)

    @staticmethod
    def upload_responses(data: bytes) -> Call[str]:
        return Call("POST", "/v1/replay-responses", lambda response: str(_json(response)["id"]), content=data)

    @staticmethod
    def delete_upload(upload_id: str) -> Call[None]:
        return Call("DELETE", f"/v1/replay-responses/{upload_id}", _ignored)

    @staticmethod
    def get(path: str) -> Call[httpx.Response]:
        return Call("GET", path, _checked)


def _http_options(url: str | None, credential: str | None) -> dict[str, Any]:
    return {
        "base_url": gateway_url(url),
        "timeout": TIMEOUT_S,
        "headers": {"Authorization": f"Bearer {credential or api_key()}"},
    }


class Gateway:
    """The gateway's HTTP API, blocking. ``credential``: an API key (default :func:`api_key`) or a
    session's token (that session only); ``transport``: httpx's, for tests. Raises
    :class:`GatewayError` for a refusal."""

    def __init__(
        self, url: str | None = None, credential: str | None = None, *, transport: httpx.BaseTransport | None = None
    ) -> None:
        self._http = httpx.Client(**_http_options(url, credential), transport=transport)
        self.url = str(self._http.base_url).rstrip("/")

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def send(self, call: Call[T]) -> T:
        return call.read(self._http.request(call.method, call.path, **call.options()))

    def create_session(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.send(calls.create_session(body))

    def session(self, session_id: str) -> dict[str, Any]:
        return self.send(calls.session(session_id))

    def sessions(self) -> list[dict[str, Any]]:
        return self.send(calls.sessions())

    def update_session(self, session_id: str, allow: Sequence[str], egress_mode: str | None = None) -> dict[str, Any]:
        return self.send(calls.update_session(session_id, allow, egress_mode))

    def delete_session(self, session_id: str, missing_ok: bool = False) -> None:
        self.send(calls.delete_session(session_id, missing_ok))

    def act(self, session_id: str, message: dict[str, Any]) -> dict[str, Any]:
        """One message through ``POST /v1/sessions/{id}/actions``: the sandbox's reply, ``ok`` or not."""
        return self.send(calls.act(session_id, message))

    def traffic(self, session_id: str, **filters: str) -> list[dict[str, Any]]:
        return self.send(calls.traffic(session_id, filters))

    def upload_responses(self, data: bytes) -> str:
        return self.send(calls.upload_responses(data))

    def delete_upload(self, upload_id: str) -> None:
        self.send(calls.delete_upload(upload_id))

    def get(self, path: str) -> httpx.Response:
        return self.send(calls.get(path))


class AsyncGateway:
    """The async twin of :class:`Gateway`."""

    def __init__(
        self,
        url: str | None = None,
        credential: str | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(**_http_options(url, credential), transport=transport)
        self.url = str(self._http.base_url).rstrip("/")

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def send(self, call: Call[T]) -> T:
        return call.read(await self._http.request(call.method, call.path, **call.options()))

    async def create_session(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.send(calls.create_session(body))

    async def session(self, session_id: str) -> dict[str, Any]:
        return await self.send(calls.session(session_id))

    async def sessions(self) -> list[dict[str, Any]]:
        return await self.send(calls.sessions())

    async def update_session(
        self, session_id: str, allow: Sequence[str], egress_mode: str | None = None
    ) -> dict[str, Any]:
        return await self.send(calls.update_session(session_id, allow, egress_mode))

    async def delete_session(self, session_id: str, missing_ok: bool = False) -> None:
        await self.send(calls.delete_session(session_id, missing_ok))

    async def act(self, session_id: str, message: dict[str, Any]) -> dict[str, Any]:
        return await self.send(calls.act(session_id, message))

    async def traffic(self, session_id: str, **filters: str) -> list[dict[str, Any]]:
        return await self.send(calls.traffic(session_id, filters))

    async def upload_responses(self, data: bytes) -> str:
        return await self.send(calls.upload_responses(data))

    async def delete_upload(self, upload_id: str) -> None:
        await self.send(calls.delete_upload(upload_id))

    async def get(self, path: str) -> httpx.Response:
        return await self.send(calls.get(path))


# -- the sandbox's messages and how their replies are read (pure) ---------------------------------------


@dataclass(frozen=True, slots=True)
class Message(Generic[T]):
    """One message to the sandbox and how its reply is read."""

    body: dict[str, Any]
    read: Callable[[dict[str, Any]], T]


def _same(reply: dict[str, Any]) -> dict[str, Any]:
    return reply


def _result(reply: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = check_reply(reply)["result"]
    return result


def _image(reply: dict[str, Any]) -> bytes:
    return image_bytes(check_reply(reply))


def _position(reply: dict[str, Any]) -> tuple[int, int]:
    result = _result(reply)
    return int(result["x"]), int(result["y"])


def _tabs(reply: dict[str, Any]) -> list[dict[str, Any]]:
    tabs: list[dict[str, Any]] = _result(reply)["tabs"]
    return tabs


def _text(reply: dict[str, Any]) -> str:
    return str(_result(reply)["text"])


def _done(reply: dict[str, Any]) -> None:
    check_reply(reply)


def _tool_result(reply: dict[str, Any]) -> list[Any]:
    content: list[Any] = _result(reply)["tool_result_content"]
    return content


def _call_output(reply: dict[str, Any]) -> dict[str, Any]:
    output: dict[str, Any] = _result(reply)["output"]
    return output


def _display(display: tuple[int, int] | None) -> dict[str, Any]:
    return {} if display is None else {"display": {"width": display[0], "height": display[1]}}


def _given(**fields: Any) -> dict[str, Any]:
    return {name: value for name, value in fields.items() if value is not None}


class messages:  # a namespace of pure builders, read as messages.click(...)
    """Every message of the SDK's vocabulary, built without sending it."""

    @staticmethod
    def request(message: dict[str, Any]) -> Message[dict[str, Any]]:
        return Message(message, _same)

    @staticmethod
    def act(action: dict[str, Any], envelope: dict[str, Any]) -> Message[dict[str, Any]]:
        return Message({"action": action, **envelope}, check_reply)

    @staticmethod
    def result(action: dict[str, Any]) -> Message[dict[str, Any]]:
        return Message({"action": action}, _result)

    @staticmethod
    def anthropic(tool_input: dict[str, Any], display: tuple[int, int] | None) -> Message[list[Any]]:
        return Message({"anthropic": tool_input, **_display(display)}, _tool_result)

    @staticmethod
    def openai(
        action: dict[str, Any] | list[dict[str, Any]], display: tuple[int, int] | None
    ) -> Message[dict[str, Any]]:
        return Message({"openai": action, **_display(display)}, _call_output)

    @staticmethod
    def screenshot(format: str, options: dict[str, Any]) -> Message[bytes]:
        return Message({"action": {"type": "screenshot", "format": format, **options}}, _image)

    @staticmethod
    def zoom(x: int, y: int, width: int, height: int, options: dict[str, Any]) -> Message[bytes]:
        region = {"x": x, "y": y, "width": width, "height": height}
        return Message({"action": {"type": "zoom", "region": region, **options}}, _image)

    @staticmethod
    def click(
        x: int | None, y: int | None, button: str, count: int, modifiers: Sequence[str], envelope: dict[str, Any]
    ) -> Message[dict[str, Any]]:
        action: dict[str, Any] = {"type": "click", "button": button, "count": count, "modifiers": list(modifiers)}
        if x is not None and y is not None:
            action.update(x=x, y=y)
        return messages.act(action, envelope)

    @staticmethod
    def scroll(
        x: int | None,
        y: int | None,
        direction: str | None,
        clicks: int | None,
        dx: int | None,
        dy: int | None,
        envelope: dict[str, Any],
    ) -> Message[dict[str, Any]]:
        action = {"type": "scroll", **_given(x=x, y=y, direction=direction, clicks=clicks, dx=dx, dy=dy)}
        return messages.act(action, envelope)

    @staticmethod
    def drag(path: Sequence[tuple[int, int]], envelope: dict[str, Any]) -> Message[dict[str, Any]]:
        return messages.act({"type": "drag", "path": [{"x": x, "y": y} for x, y in path]}, envelope)

    @staticmethod
    def key(keys: str, hold_ms: int | None, envelope: dict[str, Any]) -> Message[dict[str, Any]]:
        return messages.act({"type": "key", "keys": keys, **_given(hold_ms=hold_ms)}, envelope)

    @staticmethod
    def cursor_position() -> Message[tuple[int, int]]:
        return Message({"action": {"type": "cursor_position"}}, _position)

    @staticmethod
    def tabs() -> Message[list[dict[str, Any]]]:
        return Message({"action": {"type": "tabs"}}, _tabs)

    @staticmethod
    def clipboard_get() -> Message[str]:
        return Message({"action": {"type": "clipboard_get"}}, _text)

    @staticmethod
    def clipboard_set(text: str) -> Message[None]:
        return Message({"action": {"type": "clipboard_set", "text": text}}, _done)


# -- the twins ----------------------------------------------------------------------------------------


class Sandbox:
    """A session with its own WebSocket; deleted when the ``with`` block ends."""

    def __init__(self, info: dict[str, Any], token: str, gateway: Gateway) -> None:
        self.info = info
        self.id: str = info["id"]
        self._gateway = gateway
        self._ws = SandboxClient(f"{info['ws_url']}?token={token}")
        self._ws.__enter__()

    @classmethod
    def create(
        cls,
        allow: Sequence[str] | None = None,
        *,
        viewport: tuple[int, int] | None = None,
        timeout_s: int | None = None,
        idle_timeout_s: int | None = None,
        labels: dict[str, str] | None = None,
        egress_mode: str | None = None,
        url: str | None = None,
        api_key: str | None = None,
        hermetic_responses: bytes | None = None,
    ) -> Sandbox:
        """A new session. With ``hermetic_responses`` (a recording's ``responses.mitm``) its proxy
        answers only from those and has no route out: a hermetic replay."""
        gateway = Gateway(url, api_key)
        info: dict[str, Any] | None = None
        try:
            upload = None if hermetic_responses is None else gateway.upload_responses(hermetic_responses)
            try:
                body = session_body(allow, viewport, timeout_s, idle_timeout_s, labels, egress_mode, upload)
                info = gateway.create_session(body)
            finally:
                if upload is not None:  # the session keeps its own copy
                    with contextlib.suppress(httpx.HTTPError):
                        gateway.delete_upload(upload)
            return cls(info, info["token"], gateway)
        except BaseException:
            if info is not None:  # created, but the WebSocket failed: do not leave it running
                with contextlib.suppress(httpx.HTTPError, GatewayError):
                    gateway.delete_session(info["id"])
            gateway.close()
            raise

    @classmethod
    def attach(cls, session_id: str, token: str, *, url: str | None = None) -> Sandbox:
        """Open an existing session with its token; :meth:`close` leaves it running."""
        gateway = Gateway(url, token)
        try:
            return cls(gateway.session(session_id), token, gateway)
        except BaseException:
            gateway.close()
            raise

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.delete()

    def close(self) -> None:
        """Drop the connection and keep the session running."""
        self._ws.__exit__(None, None, None)
        self._gateway.close()

    def delete(self) -> None:
        """End the session (its sandbox is removed) and drop the connection."""
        self._ws.__exit__(None, None, None)
        try:
            self._gateway.delete_session(self.id, missing_ok=True)
        finally:
            self._gateway.close()

    @property
    def container(self) -> str:
        """The sandbox container's name (for ``docker exec`` and logs)."""
        return str(self.info["container"])

    def _send(self, message: Message[T]) -> T:
        return message.read(self._ws.request(message.body))

    # -- egress ----------------------------------------------------------------------------------------

    def set_allow(self, allow: Sequence[str], egress_mode: str | None = None) -> list[str]:
        """Replace the live allowlist (logged in the audit log); returns it in canonical form."""
        self.info = self._gateway.update_session(self.id, allow, egress_mode)
        return list(self.info["allow"])

    def traffic(self, **filters: str) -> list[dict[str, Any]]:
        """The session's audit records (filters: host, decision, event, action, since, until)."""
        return self._gateway.traffic(self.id, **filters)

    # -- messages --------------------------------------------------------------------------------------

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """Any message; its reply as it came (``ok`` true or false)."""
        return self._send(messages.request(message))

    def act(self, action: dict[str, Any], **envelope: Any) -> dict[str, Any]:
        """A native action; raises :class:`ActionFailed` on an error reply."""
        return self._send(messages.act(action, envelope))

    def run_anthropic(self, tool_input: dict[str, Any], display: tuple[int, int] | None = None) -> list[Any]:
        """The content of the ``tool_result`` for one computer-tool call."""
        return self._send(messages.anthropic(tool_input, display))

    def run_openai(
        self, action: dict[str, Any] | list[dict[str, Any]], display: tuple[int, int] | None = None
    ) -> dict[str, Any]:
        """The ``computer_call_output.output`` for one computer call (an action or a batch)."""
        return self._send(messages.openai(action, display))

    # -- the native vocabulary -------------------------------------------------------------------------

    def screenshot(self, format: str = "png", **options: Any) -> bytes:
        return self._send(messages.screenshot(format, options))

    def zoom(self, x: int, y: int, width: int, height: int, **options: Any) -> bytes:
        return self._send(messages.zoom(x, y, width, height, options))

    def click(
        self,
        x: int | None = None,
        y: int | None = None,
        *,
        button: str = "left",
        count: int = 1,
        modifiers: Sequence[str] = (),
        **envelope: Any,
    ) -> dict[str, Any]:
        return self._send(messages.click(x, y, button, count, modifiers, envelope))

    def double_click(self, x: int | None = None, y: int | None = None, **envelope: Any) -> dict[str, Any]:
        return self._send(messages.click(x, y, "left", 2, (), envelope))

    def right_click(self, x: int | None = None, y: int | None = None, **envelope: Any) -> dict[str, Any]:
        return self._send(messages.click(x, y, "right", 1, (), envelope))

    def mouse_down(self, button: str = "left") -> dict[str, Any]:
        return self._send(messages.act({"type": "mouse_down", "button": button}, {}))

    def mouse_up(self, button: str = "left") -> dict[str, Any]:
        return self._send(messages.act({"type": "mouse_up", "button": button}, {}))

    def move(self, x: int, y: int) -> dict[str, Any]:
        return self._send(messages.act({"type": "move", "x": x, "y": y}, {}))

    def drag(self, path: Sequence[tuple[int, int]], **envelope: Any) -> dict[str, Any]:
        return self._send(messages.drag(path, envelope))

    def scroll(
        self,
        x: int | None = None,
        y: int | None = None,
        *,
        direction: str | None = None,
        clicks: int | None = None,
        dx: int | None = None,
        dy: int | None = None,
        **envelope: Any,
    ) -> dict[str, Any]:
        return self._send(messages.scroll(x, y, direction, clicks, dx, dy, envelope))

    def type(self, text: str, **envelope: Any) -> dict[str, Any]:
        return self._send(messages.act({"type": "type", "text": text}, envelope))

    def key(self, keys: str, *, hold_ms: int | None = None, **envelope: Any) -> dict[str, Any]:
        return self._send(messages.key(keys, hold_ms, envelope))

    def wait(self, ms: int) -> dict[str, Any]:
        return self._send(messages.act({"type": "wait", "ms": ms}, {}))

    def cursor_position(self) -> tuple[int, int]:
        return self._send(messages.cursor_position())

    def navigate(self, url: str, **options: Any) -> dict[str, Any]:
        return self._send(messages.result({"type": "navigate", "url": url, **options}))

    def back(self) -> dict[str, Any]:
        return self._send(messages.result({"type": "back"}))

    def forward(self) -> dict[str, Any]:
        return self._send(messages.result({"type": "forward"}))

    def reload(self) -> dict[str, Any]:
        return self._send(messages.result({"type": "reload"}))

    def page_info(self) -> dict[str, Any]:
        return self._send(messages.result({"type": "page_info"}))

    def tabs(self) -> list[dict[str, Any]]:
        return self._send(messages.tabs())

    def tab_new(self, url: str | None = None) -> dict[str, Any]:
        return self._send(messages.result({"type": "tab_new", "url": url}))

    def tab_switch(self, tab: str | int) -> dict[str, Any]:
        return self._send(messages.result({"type": "tab_switch", "tab": tab}))

    def tab_close(self, tab: str | int | None = None) -> dict[str, Any]:
        return self._send(messages.result({"type": "tab_close", "tab": tab}))

    def clipboard_get(self) -> str:
        return self._send(messages.clipboard_get())

    def clipboard_set(self, text: str) -> None:
        self._send(messages.clipboard_set(text))


class AsyncSandbox:
    """The async twin of :class:`Sandbox`: ``async with await AsyncSandbox.create(...) as sb``."""

    def __init__(self, info: dict[str, Any], token: str, gateway: AsyncGateway) -> None:
        self.info = info
        self.id: str = info["id"]
        self._gateway = gateway
        self._ws = AsyncSandboxClient(f"{info['ws_url']}?token={token}")  # opened by create/attach

    @classmethod
    async def create(
        cls,
        allow: Sequence[str] | None = None,
        *,
        viewport: tuple[int, int] | None = None,
        timeout_s: int | None = None,
        idle_timeout_s: int | None = None,
        labels: dict[str, str] | None = None,
        egress_mode: str | None = None,
        url: str | None = None,
        api_key: str | None = None,
        hermetic_responses: bytes | None = None,
    ) -> AsyncSandbox:
        """A new session. With ``hermetic_responses`` (a recording's ``responses.mitm``) its proxy
        answers only from those and has no route out: a hermetic replay."""
        gateway = AsyncGateway(url, api_key)
        info: dict[str, Any] | None = None
        try:
            upload = None if hermetic_responses is None else await gateway.upload_responses(hermetic_responses)
            try:
                body = session_body(allow, viewport, timeout_s, idle_timeout_s, labels, egress_mode, upload)
                info = await gateway.create_session(body)
            finally:
                if upload is not None:  # the session keeps its own copy
                    with contextlib.suppress(httpx.HTTPError):
                        await gateway.delete_upload(upload)
            sandbox = cls(info, info["token"], gateway)
            await sandbox._ws.__aenter__()
            return sandbox
        except BaseException:
            if info is not None:  # created, but the WebSocket failed: do not leave it running
                with contextlib.suppress(httpx.HTTPError, GatewayError):
                    await gateway.delete_session(info["id"])
            await gateway.close()
            raise

    @classmethod
    async def attach(cls, session_id: str, token: str, *, url: str | None = None) -> AsyncSandbox:
        """Open an existing session with its token; :meth:`close` leaves it running."""
        gateway = AsyncGateway(url, token)
        try:
            sandbox = cls(await gateway.session(session_id), token, gateway)
            await sandbox._ws.__aenter__()
            return sandbox
        except BaseException:
            await gateway.close()
            raise

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.delete()

    async def close(self) -> None:
        """Drop the connection and keep the session running."""
        await self._ws.__aexit__(None, None, None)
        await self._gateway.close()

    async def delete(self) -> None:
        """End the session (its sandbox is removed) and drop the connection."""
        await self._ws.__aexit__(None, None, None)
        try:
            await self._gateway.delete_session(self.id, missing_ok=True)
        finally:
            await self._gateway.close()

    @property
    def container(self) -> str:
        """The sandbox container's name (for ``docker exec`` and logs)."""
        return str(self.info["container"])

    async def _send(self, message: Message[T]) -> T:
        return message.read(await self._ws.request(message.body))

    # -- egress ----------------------------------------------------------------------------------------

    async def set_allow(self, allow: Sequence[str], egress_mode: str | None = None) -> list[str]:
        """Replace the live allowlist (logged in the audit log); returns it in canonical form."""
        self.info = await self._gateway.update_session(self.id, allow, egress_mode)
        return list(self.info["allow"])

    async def traffic(self, **filters: str) -> list[dict[str, Any]]:
        """The session's audit records (filters: host, decision, event, action, since, until)."""
        return await self._gateway.traffic(self.id, **filters)

    # -- messages --------------------------------------------------------------------------------------

    async def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """Any message; its reply as it came (``ok`` true or false)."""
        return await self._send(messages.request(message))

    async def act(self, action: dict[str, Any], **envelope: Any) -> dict[str, Any]:
        """A native action; raises :class:`ActionFailed` on an error reply."""
        return await self._send(messages.act(action, envelope))

    async def run_anthropic(self, tool_input: dict[str, Any], display: tuple[int, int] | None = None) -> list[Any]:
        """The content of the ``tool_result`` for one computer-tool call."""
        return await self._send(messages.anthropic(tool_input, display))

    async def run_openai(
        self, action: dict[str, Any] | list[dict[str, Any]], display: tuple[int, int] | None = None
    ) -> dict[str, Any]:
        """The ``computer_call_output.output`` for one computer call (an action or a batch)."""
        return await self._send(messages.openai(action, display))

    # -- the native vocabulary -------------------------------------------------------------------------

    async def screenshot(self, format: str = "png", **options: Any) -> bytes:
        return await self._send(messages.screenshot(format, options))

    async def zoom(self, x: int, y: int, width: int, height: int, **options: Any) -> bytes:
        return await self._send(messages.zoom(x, y, width, height, options))

    async def click(
        self,
        x: int | None = None,
        y: int | None = None,
        *,
        button: str = "left",
        count: int = 1,
        modifiers: Sequence[str] = (),
        **envelope: Any,
    ) -> dict[str, Any]:
        return await self._send(messages.click(x, y, button, count, modifiers, envelope))

    async def double_click(self, x: int | None = None, y: int | None = None, **envelope: Any) -> dict[str, Any]:
        return await self._send(messages.click(x, y, "left", 2, (), envelope))

    async def right_click(self, x: int | None = None, y: int | None = None, **envelope: Any) -> dict[str, Any]:
        return await self._send(messages.click(x, y, "right", 1, (), envelope))

    async def mouse_down(self, button: str = "left") -> dict[str, Any]:
        return await self._send(messages.act({"type": "mouse_down", "button": button}, {}))

    async def mouse_up(self, button: str = "left") -> dict[str, Any]:
        return await self._send(messages.act({"type": "mouse_up", "button": button}, {}))

    async def move(self, x: int, y: int) -> dict[str, Any]:
        return await self._send(messages.act({"type": "move", "x": x, "y": y}, {}))

    async def drag(self, path: Sequence[tuple[int, int]], **envelope: Any) -> dict[str, Any]:
        return await self._send(messages.drag(path, envelope))

    async def scroll(
        self,
        x: int | None = None,
        y: int | None = None,
        *,
        direction: str | None = None,
        clicks: int | None = None,
        dx: int | None = None,
        dy: int | None = None,
        **envelope: Any,
    ) -> dict[str, Any]:
        return await self._send(messages.scroll(x, y, direction, clicks, dx, dy, envelope))

    async def type(self, text: str, **envelope: Any) -> dict[str, Any]:
        return await self._send(messages.act({"type": "type", "text": text}, envelope))

    async def key(self, keys: str, *, hold_ms: int | None = None, **envelope: Any) -> dict[str, Any]:
        return await self._send(messages.key(keys, hold_ms, envelope))

    async def wait(self, ms: int) -> dict[str, Any]:
        return await self._send(messages.act({"type": "wait", "ms": ms}, {}))

    async def cursor_position(self) -> tuple[int, int]:
        return await self._send(messages.cursor_position())

    async def navigate(self, url: str, **options: Any) -> dict[str, Any]:
        return await self._send(messages.result({"type": "navigate", "url": url, **options}))

    async def back(self) -> dict[str, Any]:
        return await self._send(messages.result({"type": "back"}))

    async def forward(self) -> dict[str, Any]:
        return await self._send(messages.result({"type": "forward"}))

    async def reload(self) -> dict[str, Any]:
        return await self._send(messages.result({"type": "reload"}))

    async def page_info(self) -> dict[str, Any]:
        return await self._send(messages.result({"type": "page_info"}))

    async def tabs(self) -> list[dict[str, Any]]:
        return await self._send(messages.tabs())

    async def tab_new(self, url: str | None = None) -> dict[str, Any]:
        return await self._send(messages.result({"type": "tab_new", "url": url}))

    async def tab_switch(self, tab: str | int) -> dict[str, Any]:
        return await self._send(messages.result({"type": "tab_switch", "tab": tab}))

    async def tab_close(self, tab: str | int | None = None) -> dict[str, Any]:
        return await self._send(messages.result({"type": "tab_close", "tab": tab}))

    async def clipboard_get(self) -> str:
        return await self._send(messages.clipboard_get())

    async def clipboard_set(self, text: str) -> None:
        await self._send(messages.clipboard_set(text))


__all__ = [
    "ActionFailed",
    "AsyncGateway",
    "AsyncSandbox",
    "Call",
    "Gateway",
    "GatewayError",
    "Message",
    "Sandbox",
    "api_key",
    "gateway_url",
    "session_body",
]
