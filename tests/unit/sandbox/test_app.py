"""The controller's routes that need no X server: the error body is the gateway's shape."""

from __future__ import annotations

import asyncio
import json
import warnings
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from corral.contracts import auth
from corral.contracts.placeholders import new_placeholder
from corral.errors import error_body
from corral.protocol import actions
from corral.protocol import results as r
from corral.protocol.envelope import Limits
from corral.sandbox import app as controller_app
from corral.sandbox.app import Connection, create_app
from corral.sandbox.control.lease import ControlLease
from corral.sandbox.desktop import Desktop
from corral.sandbox.dispatch import Dispatcher, Incoming
from corral.sandbox.settings import ControllerSettings

from .desktop_fake import Parts, fake_desktop, settled

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette's note about httpx, on import
    from starlette.testclient import TestClient

SECRET = auth.new_secret()
JSON = {"content-type": "application/json"}


def test_a_controller_that_does_not_record_says_so_in_the_one_error_body() -> None:
    app = create_app(ControllerSettings(record=False))
    # Wired by hand as the lifespan would (it starts the desktop, which needs X).
    app.state.verifier = auth.RequestVerifier(SECRET)
    app.state.recorder = None
    signed = auth.sign(SECRET)
    reply = TestClient(app).get("/v1/recording", headers=signed.headers)
    assert reply.status_code == 404
    assert reply.json() == error_body("not_recording", "recording is off")
    assert reply.json() == {"ok": False, "error": {"code": "not_recording", "message": "recording is off"}}
    assert auth.proven(SECRET, signed.nonce, reply.headers)


class _Recorder:
    def __init__(self) -> None:
        self.asked: list[tuple[int, int]] = []

    async def after(self, after: int, wait_ms: int) -> dict[str, Any]:
        self.asked.append((after, wait_ms))
        return {"events": [], "next": after}


def test_the_recording_route_reads_whole_numbers_and_names_a_bad_one() -> None:
    app = create_app(ControllerSettings(record=False))
    app.state.verifier = auth.RequestVerifier(SECRET)
    recorder = _Recorder()
    app.state.recorder = recorder
    client = TestClient(app)
    good = client.get("/v1/recording?after=7&wait_ms=99999", headers=auth.sign(SECRET).headers)
    assert good.status_code == 200 and good.json() == {"events": [], "next": 7}
    bad = client.get("/v1/recording?after=seven", headers=auth.sign(SECRET).headers)
    assert bad.status_code == 400
    assert bad.json()["error"] == {
        "code": "invalid_field",
        "message": "after must be a whole number, not 'seven'",
        "field": "after",
    }
    assert recorder.asked == [(7, 30_000)]  # the long poll is capped; the bad request asked nothing


class _Relays:
    def __init__(self) -> None:
        self.closed: list[float] = []

    async def close(self, timeout_s: float) -> None:
        self.closed.append(timeout_s)


def test_the_sessions_end_closes_the_cdp_connections_and_answers_once_they_ended() -> None:
    app = create_app(ControllerSettings(record=False))
    app.state.verifier = auth.RequestVerifier(SECRET)
    relays = _Relays()
    app.state.cdp_relays = relays
    client = TestClient(app)
    headers = {**auth.sign(SECRET).headers, **JSON}
    assert client.post("/v1/cdp/close?wait_ms=99999", headers=headers, json={}).json() == {"ok": True}
    bad = client.post("/v1/cdp/close?wait_ms=soon", headers={**auth.sign(SECRET).headers, **JSON}, json={})
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "wait_ms"
    unsigned = client.post("/v1/cdp/close", headers=JSON, json={})  # the agent has no controller secret
    assert unsigned.status_code == 401
    assert relays.closed == [30.0]  # capped; the refused requests closed nothing


TOKEN = new_placeholder()


def _controller() -> tuple[TestClient, Desktop]:
    """The app wired by hand as the lifespan would, over a desktop of stand-in parts."""
    app = create_app(ControllerSettings(record=False))
    desktop = fake_desktop(Parts())
    app.state.verifier = auth.RequestVerifier(SECRET)
    app.state.desktop = desktop
    app.state.dispatcher = Dispatcher(desktop, Limits())
    app.state.max_body = Limits().max_message_bytes
    return TestClient(app), desktop


def _put(client: TestClient, body: Any, headers: dict[str, str] | None = None) -> Any:
    signed = auth.sign(SECRET)
    reply = client.put("/v1/secrets", content=json.dumps(body), headers={**JSON, **signed.headers, **(headers or {})})
    assert auth.proven(SECRET, signed.nonce, reply.headers)
    return reply


def test_the_gateway_puts_the_whole_set_and_the_secrets_action_answers_it() -> None:
    client, desktop = _controller()
    other = new_placeholder()
    reply = _put(client, {"secrets": {"GITHUB_TOKEN": TOKEN, "NPM_TOKEN": other}})
    assert reply.status_code == 200
    assert reply.json() == {"ok": True, "secrets": {"GITHUB_TOKEN": TOKEN, "NPM_TOKEN": other}}
    assert dict(desktop.placeholders.by_name) == {"GITHUB_TOKEN": TOKEN, "NPM_TOKEN": other}
    # The whole set each time: a name left out is revoked.
    assert _put(client, {"secrets": {"NPM_TOKEN": other}}).status_code == 200
    signed = auth.sign(SECRET)
    action = client.post("/v1/actions", json={"id": 1, "action": {"type": "secrets"}}, headers=signed.headers)
    assert action.status_code == 200 and action.json()["result"] == {"secrets": {"NPM_TOKEN": other}}


def test_the_gateway_reads_the_placeholders_back_signed_and_a_stranger_may_not() -> None:
    client, _ = _controller()
    signed = auth.sign(SECRET)
    empty = client.get("/v1/secrets", headers=signed.headers)  # a restarted controller holds none
    answer = empty.json()
    assert empty.status_code == 200 and answer == {"ok": True, "secrets": {}, "boot": answer["boot"]}
    assert len(answer["boot"]) == 16  # this controller process's, for the gateway's restart count
    assert auth.proven(SECRET, signed.nonce, empty.headers)
    assert _put(client, {"secrets": {"GITHUB_TOKEN": TOKEN}}).status_code == 200
    held = client.get("/v1/secrets", headers=auth.sign(SECRET).headers)
    assert held.json() == {"ok": True, "secrets": {"GITHUB_TOKEN": TOKEN}, "boot": answer["boot"]}
    assert client.get("/v1/secrets").status_code == 401


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        ({"secrets": {"PATH": TOKEN}}, "invalid_field", "secrets.PATH"),
        ({"secrets": {"GITHUB_TOKEN": "not-a-placeholder"}}, "invalid_field", "secrets.GITHUB_TOKEN"),
        ({"secrets": {f"S{i}": new_placeholder() for i in range(33)}}, "invalid_field", "secrets"),
        ({"placeholders": {}}, "unknown_field", "placeholders"),
        ({}, "missing_field", "secrets"),
        ([], "invalid_request", None),
    ],
)
def test_a_bad_body_is_a_structured_error_and_changes_nothing(body: Any, code: str, field: str | None) -> None:
    client, desktop = _controller()
    assert _put(client, {"secrets": {"GITHUB_TOKEN": TOKEN}}).status_code == 200
    reply = _put(client, body)
    assert reply.status_code == 400
    assert reply.json()["ok"] is False and reply.json()["error"]["code"] == code
    assert reply.json()["error"].get("field") == field
    assert dict(desktop.placeholders.by_name) == {"GITHUB_TOKEN": TOKEN}


def test_a_body_that_is_not_json_or_too_big_changes_nothing() -> None:
    client, desktop = _controller()
    signed = auth.sign(SECRET)
    reply = client.put("/v1/secrets", content=b"{not json", headers={**JSON, **signed.headers})
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "invalid_json"
    signed = auth.sign(SECRET)
    huge = json.dumps({"secrets": {"A": "x" * (2 << 20)}})
    reply = client.put("/v1/secrets", content=huge, headers={**JSON, **signed.headers})
    assert reply.status_code == 413 and reply.json()["error"]["code"] == "message_too_large"
    assert dict(desktop.placeholders.by_name) == {}


def test_only_a_caller_with_the_controllers_secret_may_put_placeholders() -> None:
    client, desktop = _controller()
    body = json.dumps({"secrets": {"GITHUB_TOKEN": TOKEN}})
    unsigned = client.put("/v1/secrets", content=body, headers=JSON)
    assert unsigned.status_code == 401 and unsigned.json()["error"]["code"] == "unauthorized"
    forged = auth.sign(auth.new_secret()).headers  # some other secret's MAC
    assert client.put("/v1/secrets", content=body, headers={**JSON, **forged}).status_code == 401
    replayed = auth.sign(SECRET).headers
    empty = json.dumps({"secrets": {}})
    assert client.put("/v1/secrets", content=empty, headers={**JSON, **replayed}).status_code == 200
    assert client.put("/v1/secrets", content=body, headers={**JSON, **replayed}).status_code == 401  # used before
    # A page the agent opened: refused before the secret is even looked at.
    browser = {**JSON, **auth.sign(SECRET).headers, "origin": "https://allowed.test"}
    assert client.put("/v1/secrets", content=body, headers=browser).status_code == 403
    # A form post (text/plain, no preflight) is not JSON: refused.
    form = {"content-type": "text/plain", **auth.sign(SECRET).headers}
    assert client.put("/v1/secrets", content=body, headers=form).status_code == 415
    assert dict(desktop.placeholders.by_name) == {}


class _Socket:
    """A WebSocket's two ends for :class:`Connection`: messages the test puts in, frames it sent."""

    def __init__(self) -> None:
        self.incoming: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.sent: list[dict[str, Any]] = []
        self.changed = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        return await self.incoming.get()

    async def send_text(self, frame: str) -> None:
        self.sent.append(json.loads(frame))
        self.changed.set()

    async def frames(self, count: int) -> list[dict[str, Any]]:
        while len(self.sent) < count:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), 5)
        return self.sent


RUNNING = r.OutputEvent(id=1, stream="stdout", data="running", encoding="utf-8")  # what a held command prints


class _Dispatcher:
    """Reads ``{"id", "apart"}``; a request with ``"hold"`` runs until a later one says ``release``."""

    def __init__(self) -> None:
        self.released = asyncio.Event()

    def read(self, raw: str) -> Incoming:
        request = json.loads(raw)
        return Incoming(request, request["id"], None, None, 0.0, 0.0)

    async def wait_for_control(self, incoming: Incoming) -> Incoming:
        return incoming

    async def run(self, incoming: Incoming, emit: Any, listening: Any = None) -> dict[str, Any]:
        request = incoming.request
        if request.get("release"):
            self.released.set()
        if request.get("hold"):
            await emit(RUNNING)
            await self.released.wait()
        return {"ok": True, "id": request["id"]}


async def test_a_command_running_on_a_connection_does_not_hold_up_the_next_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Incoming, "apart", property(lambda self: self.request.get("apart", False)))
    socket, dispatcher = _Socket(), _Dispatcher()
    serving = asyncio.create_task(Connection(socket, dispatcher).serve())  # type: ignore[arg-type]
    socket.incoming.put_nowait({"type": "websocket.receive", "text": '{"id": 1, "apart": true, "hold": true}'})
    socket.incoming.put_nowait({"type": "websocket.receive", "text": '{"id": 2}'})
    socket.incoming.put_nowait({"type": "websocket.receive", "text": '{"id": 3, "apart": true, "release": true}'})
    frames = await socket.frames(4)
    # The desktop request and the release are answered while the command runs; its event came before
    # its reply, which is last.
    assert frames[3] == {"ok": True, "id": 1}
    assert sorted(frames[:3], key=str) == sorted(
        [RUNNING.wire(), {"ok": True, "id": 2}, {"ok": True, "id": 3}], key=str
    )
    socket.incoming.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(serving, 5)


async def test_commands_cancelled_at_the_end_of_a_connection_have_finished_when_serve_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Incoming, "apart", property(lambda self: self.request.get("apart", False)))
    cleaning, cleaned = asyncio.Event(), asyncio.Event()

    class Cleaning(_Dispatcher):
        async def run(self, incoming: Incoming, emit: Any, listening: Any = None) -> dict[str, Any]:
            try:
                return await super().run(incoming, emit)
            except asyncio.CancelledError:
                cleaning.set()  # a cancelled command's clean-up (its tree's kill) takes its time
                await cleaned.wait()
                raise

    socket = _Socket()
    serving = asyncio.create_task(Connection(socket, Cleaning()).serve())  # type: ignore[arg-type]
    socket.incoming.put_nowait({"type": "websocket.receive", "text": '{"id": 1, "apart": true, "hold": true}'})
    await socket.frames(1)  # the command runs
    socket.incoming.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(cleaning.wait(), 5)
    assert not serving.done()  # serve waits for the clean-up
    cleaned.set()
    await asyncio.wait_for(serving, 5)


def test_an_exclusive_cdp_connection_is_refused_at_the_upgrade_while_a_human_holds_the_lease() -> None:
    from starlette.testclient import WebSocketDenialResponse

    client, desktop = _controller()
    desktop.lease.take("human:lnk_aaaaaaaaaaaa")
    signed = auth.sign(SECRET)
    with pytest.raises(WebSocketDenialResponse) as refused:
        client.websocket_connect("/v1/cdp?conn=cdp_0000000a&exclusive=1", headers=signed.headers).__enter__()
    assert refused.value.status_code == 409
    error = refused.value.json()["error"]
    assert (error["code"], error["holder"]) == ("control_taken", "human:lnk_aaaaaaaaaaaa")
    assert auth.proven(SECRET, signed.nonce, refused.value.headers)  # the gateway may believe the 409
    assert desktop.lease.holder.who == "human:lnk_aaaaaaaaaaaa"
    signed = auth.sign(SECRET)
    with pytest.raises(WebSocketDenialResponse) as bad:
        client.websocket_connect("/v1/cdp?conn=a%20b", headers=signed.headers).__enter__()
    assert bad.value.status_code == 400 and bad.value.json()["error"]["field"] == "conn"


def test_the_agents_websocket_keeps_its_frame_limit_under_cdps_larger_one() -> None:
    from starlette.websockets import WebSocketDisconnect

    app = create_app(ControllerSettings(record=False, ws_max_frame_bytes=1024))
    desktop = fake_desktop(Parts())
    app.state.verifier = auth.RequestVerifier(SECRET)
    app.state.desktop = desktop
    app.state.dispatcher = Dispatcher(desktop, Limits())
    with TestClient(app).websocket_connect("/v1/ws", headers=auth.sign(SECRET).headers) as ws:
        ws.send_text("x" * 1025)
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()
    assert closed.value.code == 1009


HUMAN = "human:lnk_3kq9x0a1b2c4"


def _click(wait_ms: int) -> dict[str, Any]:
    request = {"id": 1, "action": {"type": "click", "x": 1, "y": 1}, "wait_for_control_ms": wait_ms}
    return {"type": "websocket.receive", "text": json.dumps(request)}


async def test_a_connection_that_closes_while_its_request_waits_for_the_lease_leaves_nothing_to_run() -> None:
    parts = Parts()
    desktop = fake_desktop(parts)
    desktop.lease.take(HUMAN)
    socket = _Socket()
    serving = asyncio.create_task(Connection(socket, Dispatcher(desktop, Limits())).serve())  # type: ignore[arg-type]
    socket.incoming.put_nowait(_click(600_000))
    await settled(lambda: socket.incoming.empty())
    socket.incoming.put_nowait({"type": "websocket.disconnect"})
    done, _ = await asyncio.wait({serving}, timeout=5)
    serving.cancel()
    assert serving in done  # not held up by the 600 s wait
    desktop.lease.release(HUMAN, "done")
    for _ in range(10):
        await asyncio.sleep(0)
    assert not parts.methods("input")  # the click never runs after the hand-back
    handed = desktop.lease.take_hand_back()
    assert handed is not None and handed.note == "done"  # still the agent's to read


async def test_a_reply_nobody_reads_takes_no_hand_back() -> None:
    parts = Parts()
    desktop = fake_desktop(parts)
    socket = _Socket()
    serving = asyncio.create_task(Connection(socket, Dispatcher(desktop, Limits())).serve())  # type: ignore[arg-type]
    async with desktop.lock:  # an earlier action still running
        socket.incoming.put_nowait(_click(0))
        await settled(lambda: bool(desktop.lock.waiting))
        socket.incoming.put_nowait({"type": "websocket.disconnect"})
        await settled(lambda: socket.incoming.empty())
        desktop.lease.take(HUMAN)
        desktop.lease.release(HUMAN, "over to you")
    await asyncio.wait_for(serving, 5)  # the click ran (the agent held the lease again), unread
    assert parts.methods("input")
    handed = desktop.lease.take_hand_back()
    assert handed is not None and handed.note == "over to you"


class AskedLease(ControlLease):
    """The real lease, saying when a request began to wait for it."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = asyncio.Event()

    async def wait_for_return(self, wait_ms: int) -> bool:
        self.asked.set()
        return await super().wait_for_return(wait_ms)

    async def agent_may_act(self, wait_ms: int = 0) -> None:
        if wait_ms:
            self.asked.set()
        await super().agent_may_act(wait_ms)


async def test_an_http_request_waiting_for_the_lease_is_dropped_when_its_client_goes_away() -> None:
    app = create_app(ControllerSettings(record=False))
    parts = Parts()
    desktop = fake_desktop(parts)
    app.state.verifier = auth.RequestVerifier(SECRET)
    app.state.desktop = desktop
    app.state.dispatcher = Dispatcher(desktop, Limits())
    app.state.max_body = Limits().max_message_bytes
    lease = desktop.lease = AskedLease()
    lease.take(HUMAN)
    body = _click(600_000)["text"].encode()
    headers = [(k.lower().encode(), v.encode()) for k, v in {**JSON, **auth.sign(SECRET).headers}.items()]
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/v1/actions", "raw_path": b"/v1/actions", "query_string": b"", "root_path": "",
        "headers": [*headers, (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8765),
    }  # fmt: skip
    left = asyncio.Event()
    messages: list[dict[str, Any]] = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await left.wait()  # the client hangs up while the request waits
        return {"type": "http.disconnect"}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    serving = asyncio.create_task(app(scope, receive, send))
    await asyncio.wait_for(lease.asked.wait(), 5)  # the request waits for the lease
    left.set()
    done, _ = await asyncio.wait({serving}, timeout=5)
    serving.cancel()
    assert serving in done  # not held up by the 600 s wait
    assert sent[0]["status"] == 204  # answered to nobody, nothing run
    lease.release(HUMAN, "done")
    for _ in range(20):
        await asyncio.sleep(0)
    assert not parts.methods("input")  # the click never runs after the hand-back
    handed = lease.take_hand_back()
    assert handed is not None and handed.note == "done"


def test_the_downloads_routes_answer_only_the_signed_gateway() -> None:
    """An agent-uid process reaches the controller's port but holds no controller secret: the list of
    downloads and their bytes are the gateway's to ask for (it passes them on under its own auth)."""
    app = create_app(ControllerSettings(record=False))
    app.state.verifier = auth.RequestVerifier(SECRET)
    client = TestClient(app)
    for path in ("/v1/downloads", "/v1/downloads/0123456789abcdef0123456789abcdef"):
        answer = client.get(path)
        assert answer.status_code == 401 and answer.json()["error"]["code"] == "unauthorized"


async def test_a_starts_wait_on_healthz_is_answered_the_moment_the_first_page_opens() -> None:
    app = create_app(ControllerSettings(record=False))
    app.state.desktop = fake_desktop(Parts())
    kept = asyncio.Event()
    app.state.page_keeper = SimpleNamespace(kept=kept)  # the page keeper's readiness, nothing more
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://controller") as client:
        at_once = await client.get("/healthz")  # asked without a wait: "not yet" at once, as before
        assert at_once.status_code == 503 and "no page open yet" in at_once.json()["error"]
        held = asyncio.ensure_future(client.get("/healthz?wait_ms=2000"))
        for _ in range(50):
            await asyncio.sleep(0)
        assert not held.done()  # held, not answered "not yet"
        kept.set()
        answer = await asyncio.wait_for(held, 10)
        assert answer.status_code == 200 and answer.json()["ok"] is True
        bad = await client.get("/healthz?wait_ms=soon")
        assert bad.status_code == 400 and bad.json()["error"]["field"] == "wait_ms"


def test_the_warm_up_builds_the_validator_every_action_goes_through() -> None:
    # The lifespan runs it in a thread while the start waits for Chromium (docs/design/0470).
    actions.native_action.cache_clear()
    controller_app._warm_up()
    assert actions.native_action.cache_info().currsize == 1


def test_a_warm_up_that_fails_is_said_at_once_and_costs_nothing_else(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> None:
        raise RuntimeError("a model that does not build")

    monkeypatch.setattr(controller_app, "native_action", broken)
    with caplog.at_level("ERROR", logger=controller_app.__name__):
        controller_app._warm_up()  # no raise: it is a head start, the first action builds instead
    assert "the controller's warm-up failed" in caplog.text and "a model that does not build" in caplog.text
