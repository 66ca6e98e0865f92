"""The Corral SDK: create a session through the gateway and drive it.

    from corral import Sandbox
    with Sandbox.create(allow=["example.com"]) as sb:
        sb.navigate("https://example.com")
        sb.click(100, 200)
        png = sb.screenshot()

``AsyncSandbox`` is the same with ``async``/``await``: the same methods with the same parameters
(a unit test holds them to it). ``run_anthropic`` and ``run_openai`` return exactly what to send back
to each model API.

Every method is one line in each twin: a pure function of :class:`messages` builds the
:class:`Message` to the sandbox and says how its reply is read; the twins only send it, blocking or
awaited. The gateway's HTTP API is :mod:`corral.gateway_client`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import httpx

from corral.client import AsyncSandboxClient, SandboxClient, check_reply, image_bytes
from corral.errors import ActionFailed, GatewayError
from corral.gateway_client import AsyncGateway, Gateway, api_key, gateway_url, session_body

T = TypeVar("T")


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
    "Gateway",
    "GatewayError",
    "Message",
    "Sandbox",
    "api_key",
    "gateway_url",
    "messages",
]
