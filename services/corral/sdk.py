"""The Corral SDK: create a session through the gateway and drive it.

    from corral import Sandbox
    with Sandbox.create(allow=["example.com"]) as sb:
        sb.navigate("https://example.com")
        sb.click(100, 200)
        png = sb.screenshot()

``AsyncSandbox`` is the same with ``async``/``await``. ``run_anthropic`` and ``run_openai``
return exactly what to send back to each model API.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

from corral.client import ActionFailed, AsyncSandboxClient, SandboxClient, image_bytes
from corral.errors import CorralError

DEFAULT_URL = "http://127.0.0.1:8700"


class GatewayError(CorralError):
    """The gateway refused a request; ``status`` and ``code`` say why."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        error = body.get("error") or {}
        super().__init__(f"{status} {error.get('code')}: {error.get('message')}")
        self.status = status
        self.code: str = error.get("code", "")


def _default_key() -> str:
    keys = [k.strip() for k in os.environ.get("CORRAL_API_KEY", "").split(",") if k.strip()]
    if keys:
        return keys[0]
    data_dir = Path(os.environ.get("CORRAL_DATA_DIR", Path.home() / ".local" / "share" / "corral"))
    path = data_dir / "api_key"
    if path.is_file():
        return path.read_text().strip()
    raise CorralError("no API key: set CORRAL_API_KEY (see `corral status`)")


def _session_body(
    allow: Sequence[str] | None,
    viewport: tuple[int, int] | None,
    timeout_s: int | None,
    idle_timeout_s: int | None,
    labels: dict[str, str] | None,
    egress_mode: str | None = None,
    hermetic: str | None = None,
) -> dict[str, Any]:
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


def _checked(response: httpx.Response) -> dict[str, Any]:
    if response.status_code >= 400:
        try:
            body = response.json()
        except ValueError:
            body = {"error": {"code": "http_error", "message": response.text[:200]}}
        raise GatewayError(response.status_code, body)
    if response.status_code == 204:
        return {}
    data: dict[str, Any] = response.json()
    return data


def _client_options(url: str | None, credential: str) -> dict[str, Any]:
    """What both HTTP clients are built with."""
    return {
        "base_url": url or os.environ.get("CORRAL_URL", DEFAULT_URL),
        "timeout": 120,
        "headers": {"Authorization": f"Bearer {credential}"},
    }


def _tool_result(reply: dict[str, Any]) -> list[Any]:
    if not reply["ok"]:
        raise ActionFailed(reply["error"])
    content: list[Any] = reply["result"]["tool_result_content"]
    return content


def _call_output(reply: dict[str, Any]) -> dict[str, Any]:
    if not reply["ok"]:
        raise ActionFailed(reply["error"])
    output: dict[str, Any] = reply["result"]["output"]
    return output


# Native actions as messages, shared by both clients.
def _click(x: int | None, y: int | None, button: str, count: int, modifiers: Sequence[str]) -> dict[str, Any]:
    action: dict[str, Any] = {"type": "click", "button": button, "count": count, "modifiers": list(modifiers)}
    if x is not None and y is not None:
        action.update(x=x, y=y)
    return action


def _scroll(
    x: int | None, y: int | None, direction: str | None, clicks: int | None, dx: int | None, dy: int | None
) -> dict[str, Any]:
    action: dict[str, Any] = {"type": "scroll"}
    for name, value in (("x", x), ("y", y), ("direction", direction), ("clicks", clicks), ("dx", dx), ("dy", dy)):
        if value is not None:
            action[name] = value
    return action


def _path(points: Sequence[tuple[int, int]]) -> list[dict[str, int]]:
    return [{"x": x, "y": y} for x, y in points]


def _display(display: tuple[int, int] | None) -> dict[str, Any]:
    return {} if display is None else {"display": {"width": display[0], "height": display[1]}}


class Sandbox:
    """A session with its own WebSocket; deleted when the ``with`` block ends."""

    def __init__(self, info: dict[str, Any], token: str, gateway: httpx.Client) -> None:
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
        gateway = httpx.Client(**_client_options(url, api_key or _default_key()))
        info: dict[str, Any] | None = None
        try:
            upload = None
            if hermetic_responses is not None:
                upload = _checked(gateway.post("/v1/replay-responses", content=hermetic_responses))["id"]
            try:
                body = _session_body(allow, viewport, timeout_s, idle_timeout_s, labels, egress_mode, upload)
                info = _checked(gateway.post("/v1/sessions", json=body))
            finally:
                if upload is not None:  # the session keeps its own copy
                    with contextlib.suppress(httpx.HTTPError):
                        gateway.delete(f"/v1/replay-responses/{upload}")
            return cls(info, info["token"], gateway)
        except BaseException:
            if info is not None:  # created, but the WebSocket failed: do not leave it running
                with contextlib.suppress(httpx.HTTPError):
                    gateway.delete(f"/v1/sessions/{info['id']}")
            gateway.close()
            raise

    @classmethod
    def attach(cls, session_id: str, token: str, *, url: str | None = None) -> Sandbox:
        """Open an existing session with its token; :meth:`close` leaves it running."""
        gateway = httpx.Client(**_client_options(url, token))
        try:
            return cls(_checked(gateway.get(f"/v1/sessions/{session_id}")), token, gateway)
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
            _checked(self._gateway.delete(f"/v1/sessions/{self.id}"))
        except GatewayError as exc:
            if exc.status != 404:
                raise
        finally:
            self._gateway.close()

    @property
    def container(self) -> str:
        """The sandbox container's name (for ``docker exec`` and logs)."""
        return str(self.info["container"])

    # -- egress ----------------------------------------------------------------------------------------

    def set_allow(self, allow: Sequence[str], egress_mode: str | None = None) -> list[str]:
        """Replace the live allowlist (logged in the audit log); returns it in canonical form."""
        body: dict[str, Any] = {"allow": list(allow)}
        if egress_mode is not None:
            body["egress_mode"] = egress_mode
        self.info = _checked(self._gateway.patch(f"/v1/sessions/{self.id}", json=body))
        return list(self.info["allow"])

    def traffic(self, **filters: str) -> list[dict[str, Any]]:
        """The session's audit records (filters: host, decision, event, action, since, until)."""
        response = self._gateway.get(f"/v1/sessions/{self.id}/traffic", params=filters)
        if response.status_code >= 400:
            _checked(response)
        return [json.loads(line) for line in response.text.splitlines() if line.strip()]

    # -- messages --------------------------------------------------------------------------------------

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        return self._ws.request(message)

    def act(self, action: dict[str, Any], **envelope: Any) -> dict[str, Any]:
        return self._ws.act(action, **envelope)

    def run_anthropic(self, tool_input: dict[str, Any], display: tuple[int, int] | None = None) -> list[Any]:
        """The content of the ``tool_result`` for one computer-tool call."""
        return _tool_result(self._ws.request({"anthropic": tool_input, **_display(display)}))

    def run_openai(
        self, action: dict[str, Any] | list[dict[str, Any]], display: tuple[int, int] | None = None
    ) -> dict[str, Any]:
        """The ``computer_call_output.output`` for one computer call (an action or a batch)."""
        return _call_output(self._ws.request({"openai": action, **_display(display)}))

    # -- the native vocabulary -------------------------------------------------------------------------

    def screenshot(self, format: str = "png", **options: Any) -> bytes:
        return image_bytes(self.act({"type": "screenshot", "format": format, **options}))

    def zoom(self, x: int, y: int, width: int, height: int, **options: Any) -> bytes:
        region = {"x": x, "y": y, "width": width, "height": height}
        return image_bytes(self.act({"type": "zoom", "region": region, **options}))

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
        return self.act(_click(x, y, button, count, modifiers), **envelope)

    def double_click(self, x: int | None = None, y: int | None = None, **envelope: Any) -> dict[str, Any]:
        return self.act(_click(x, y, "left", 2, ()), **envelope)

    def right_click(self, x: int | None = None, y: int | None = None, **envelope: Any) -> dict[str, Any]:
        return self.act(_click(x, y, "right", 1, ()), **envelope)

    def mouse_down(self, button: str = "left") -> dict[str, Any]:
        return self.act({"type": "mouse_down", "button": button})

    def mouse_up(self, button: str = "left") -> dict[str, Any]:
        return self.act({"type": "mouse_up", "button": button})

    def move(self, x: int, y: int) -> dict[str, Any]:
        return self.act({"type": "move", "x": x, "y": y})

    def drag(self, path: Sequence[tuple[int, int]], **envelope: Any) -> dict[str, Any]:
        return self.act({"type": "drag", "path": _path(path)}, **envelope)

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
        return self.act(_scroll(x, y, direction, clicks, dx, dy), **envelope)

    def type(self, text: str, **envelope: Any) -> dict[str, Any]:
        return self.act({"type": "type", "text": text}, **envelope)

    def key(self, keys: str, *, hold_ms: int | None = None, **envelope: Any) -> dict[str, Any]:
        action: dict[str, Any] = {"type": "key", "keys": keys}
        if hold_ms is not None:
            action["hold_ms"] = hold_ms
        return self.act(action, **envelope)

    def wait(self, ms: int) -> dict[str, Any]:
        return self.act({"type": "wait", "ms": ms})

    def cursor_position(self) -> tuple[int, int]:
        result = self.act({"type": "cursor_position"})["result"]
        return int(result["x"]), int(result["y"])

    def navigate(self, url: str, **options: Any) -> dict[str, Any]:
        result: dict[str, Any] = self.act({"type": "navigate", "url": url, **options})["result"]
        return result

    def back(self) -> dict[str, Any]:
        result: dict[str, Any] = self.act({"type": "back"})["result"]
        return result

    def forward(self) -> dict[str, Any]:
        result: dict[str, Any] = self.act({"type": "forward"})["result"]
        return result

    def reload(self) -> dict[str, Any]:
        result: dict[str, Any] = self.act({"type": "reload"})["result"]
        return result

    def page_info(self) -> dict[str, Any]:
        result: dict[str, Any] = self.act({"type": "page_info"})["result"]
        return result

    def tabs(self) -> list[dict[str, Any]]:
        tabs: list[dict[str, Any]] = self.act({"type": "tabs"})["result"]["tabs"]
        return tabs

    def tab_new(self, url: str | None = None) -> dict[str, Any]:
        result: dict[str, Any] = self.act({"type": "tab_new", "url": url})["result"]
        return result

    def tab_switch(self, tab: str | int) -> dict[str, Any]:
        result: dict[str, Any] = self.act({"type": "tab_switch", "tab": tab})["result"]
        return result

    def tab_close(self, tab: str | int | None = None) -> dict[str, Any]:
        result: dict[str, Any] = self.act({"type": "tab_close", "tab": tab})["result"]
        return result

    def clipboard_get(self) -> str:
        return str(self.act({"type": "clipboard_get"})["result"]["text"])

    def clipboard_set(self, text: str) -> None:
        self.act({"type": "clipboard_set", "text": text})


class AsyncSandbox:
    """The async twin of :class:`Sandbox`: ``async with await AsyncSandbox.create(...) as sb``."""

    def __init__(self, info: dict[str, Any], token: str, gateway: httpx.AsyncClient) -> None:
        self.info = info
        self.id: str = info["id"]
        self._gateway = gateway
        self._ws = AsyncSandboxClient(f"{info['ws_url']}?token={token}")

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
    ) -> AsyncSandbox:
        gateway = httpx.AsyncClient(**_client_options(url, api_key or _default_key()))
        info: dict[str, Any] | None = None
        try:
            body = _session_body(allow, viewport, timeout_s, idle_timeout_s, labels, egress_mode)
            info = _checked(await gateway.post("/v1/sessions", json=body))
            sandbox = cls(info, info["token"], gateway)
            await sandbox._ws.__aenter__()
            return sandbox
        except BaseException:
            if info is not None:  # created, but the WebSocket failed: do not leave it running
                with contextlib.suppress(httpx.HTTPError):
                    await gateway.delete(f"/v1/sessions/{info['id']}")
            await gateway.aclose()
            raise

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.delete()

    async def delete(self) -> None:
        await self._ws.__aexit__(None, None, None)
        try:
            _checked(await self._gateway.delete(f"/v1/sessions/{self.id}"))
        except GatewayError as exc:
            if exc.status != 404:
                raise
        finally:
            await self._gateway.aclose()

    async def request(self, message: dict[str, Any]) -> dict[str, Any]:
        return await self._ws.request(message)

    async def act(self, action: dict[str, Any], **envelope: Any) -> dict[str, Any]:
        return await self._ws.act(action, **envelope)

    async def run_anthropic(self, tool_input: dict[str, Any], display: tuple[int, int] | None = None) -> list[Any]:
        return _tool_result(await self._ws.request({"anthropic": tool_input, **_display(display)}))

    async def run_openai(
        self, action: dict[str, Any] | list[dict[str, Any]], display: tuple[int, int] | None = None
    ) -> dict[str, Any]:
        return _call_output(await self._ws.request({"openai": action, **_display(display)}))

    async def screenshot(self, format: str = "png", **options: Any) -> bytes:
        return image_bytes(await self.act({"type": "screenshot", "format": format, **options}))

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
        return await self.act(_click(x, y, button, count, modifiers), **envelope)

    async def move(self, x: int, y: int) -> dict[str, Any]:
        return await self.act({"type": "move", "x": x, "y": y})

    async def drag(self, path: Sequence[tuple[int, int]], **envelope: Any) -> dict[str, Any]:
        return await self.act({"type": "drag", "path": _path(path)}, **envelope)

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
        return await self.act(_scroll(x, y, direction, clicks, dx, dy), **envelope)

    async def type(self, text: str, **envelope: Any) -> dict[str, Any]:
        return await self.act({"type": "type", "text": text}, **envelope)

    async def key(self, keys: str, **envelope: Any) -> dict[str, Any]:
        return await self.act({"type": "key", "keys": keys}, **envelope)

    async def navigate(self, url: str, **options: Any) -> dict[str, Any]:
        result: dict[str, Any] = (await self.act({"type": "navigate", "url": url, **options}))["result"]
        return result

    async def page_info(self) -> dict[str, Any]:
        result: dict[str, Any] = (await self.act({"type": "page_info"}))["result"]
        return result
