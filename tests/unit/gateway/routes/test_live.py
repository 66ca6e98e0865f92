"""``WS /v1/sessions/{id}/live`` over a fake controller: the auth message decides who watches and
how, frames pass unchanged both ways, a revoke closes a link's stream (4003), the session's end
every stream (4000), and a bad credential is refused as ``/ws`` refuses (4401/4403/4404)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from starlette.websockets import WebSocketDisconnect

from corral.gateway import relay as relay_module
from corral.gateway.app import create_app
from corral.gateway.routes import live as live_module

from .conftest import KEY, OTHER_KEY, LoopbackRuntime, TestClient, settings_for

HELLO = '{"type":"hello"}'
FRAME = b"\xff\xd8jpeg\xff\xd9"
BYE = "bye"  # the fake controller closes its side (a test's stream ends from the server, as TestClient needs)


class Controller:
    """The controller's ``/v1/live``: a hello and a frame at once, then each message echoed back
    (:data:`BYE` closes its side)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._frames: asyncio.Queue[str | bytes | None] = asyncio.Queue()
        self._frames.put_nowait(HELLO)
        self._frames.put_nowait(FRAME)

    async def send(self, message: str | bytes) -> None:
        self._frames.put_nowait(None if message == BYE else message)

    async def close(self) -> None:
        self._frames.put_nowait(None)

    def __aiter__(self) -> AsyncIterator[str | bytes]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[str | bytes]:
        while (frame := await self._frames.get()) is not None:
            yield frame


@pytest.fixture()
def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[TestClient, str, str, list[str]]]:
    """A gateway with one session of KEY's, whose controller is :class:`Controller` (the URLs it was asked for)."""
    opened: list[str] = []

    async def connect_ws(url: str, secret: str) -> Controller:
        opened.append(url)
        return Controller(url)

    monkeypatch.setattr(relay_module, "connect_ws", connect_ws)
    with TestClient(create_app(settings_for(tmp_path), runtime=LoopbackRuntime())) as client:
        made = client.post("/v1/sessions", json={}, headers={"authorization": f"Bearer {KEY}"}).json()
        yield client, made["id"], made["token"], opened


def _owner(client: TestClient, method: str, path: str, **kw: Any) -> Any:
    return client.request(method, path, headers={"authorization": f"Bearer {KEY}"}, **kw).json()


def _viewer_of(url: str) -> tuple[str, dict[str, list[str]]]:
    parts = urlsplit(url)
    return parts.path, parse_qs(parts.query)


def _refused(client: TestClient, session_id: str, first: Any) -> tuple[int, str]:
    with client.websocket_connect(f"/v1/sessions/{session_id}/live") as ws:
        if isinstance(first, str):
            ws.send_text(first)
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()
    return closed.value.code, closed.value.reason


def _auth(credential: str) -> str:
    return json.dumps({"type": "auth", "credential": credential})


@pytest.mark.parametrize(
    ("credential", "viewer", "mode"),
    [(KEY, "human:owner", "control"), (None, "agent", "view")],  # the owner, never its key id,
)
def test_the_owner_controls_the_agent_watches_and_frames_pass_unchanged(
    gateway: tuple[TestClient, str, str, list[str]], credential: str | None, viewer: str, mode: str
) -> None:
    client, session_id, token, opened = gateway
    with client.websocket_connect(f"/v1/sessions/{session_id}/live") as ws:
        ws.send_text(_auth(credential or token))
        assert ws.receive_text() == HELLO
        assert ws.receive_bytes() == FRAME  # binary stays binary
        ws.send_text('{"type":"take","seq":1}')
        assert ws.receive_text() == '{"type":"take","seq":1}'
        ws.send_bytes(b"\x00raw")
        assert ws.receive_bytes() == b"\x00raw"
        ws.send_text(BYE)
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()
    assert closed.value.code == 1000  # the controller's side closed: so does the viewer's
    assert [_viewer_of(url) for url in opened] == [("/v1/live", {"viewer": [viewer], "mode": [mode]})]


def test_a_link_watches_in_its_mode_and_its_revoke_closes_the_stream(
    gateway: tuple[TestClient, str, str, list[str]],
) -> None:
    client, session_id, _, opened = gateway
    link = _owner(client, "POST", f"/v1/sessions/{session_id}/links", json={"mode": "control"})
    secret = link["url"].split("#link=")[1]
    with client.websocket_connect(f"/v1/sessions/{session_id}/live") as ws:
        ws.send_text(_auth(secret))
        assert ws.receive_text() == HELLO
        listed = _owner(client, "GET", f"/v1/sessions/{session_id}/links")
        assert (listed[0]["streams"], listed[0]["last_used_at"] is not None) == (1, True)
        _owner(client, "DELETE", f"/v1/sessions/{session_id}/links/{link['id']}")
        assert ws.receive_bytes() == FRAME
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()
    assert (closed.value.code, closed.value.reason) == (4003, "link revoked")
    assert _viewer_of(opened[0]) == ("/v1/live", {"viewer": [f"human:{link['id']}"], "mode": ["control"]})
    assert _owner(client, "GET", f"/v1/sessions/{session_id}/links")[0]["streams"] == 0
    assert _refused(client, session_id, _auth(secret)) == (4401, "link revoked")


def test_the_session_s_end_closes_the_stream_with_4000(gateway: tuple[TestClient, str, str, list[str]]) -> None:
    client, session_id, token, _ = gateway
    with client.websocket_connect(f"/v1/sessions/{session_id}/live") as ws:
        ws.send_text(_auth(token))
        assert ws.receive_text() == HELLO
        client.delete(f"/v1/sessions/{session_id}", headers={"authorization": f"Bearer {KEY}"})
        assert ws.receive_bytes() == FRAME
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()
    assert (closed.value.code, closed.value.reason) == (4000, "session ended: deleted")


def test_bad_credentials_are_refused_as_ws_refuses_them(
    gateway: tuple[TestClient, str, str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, session_id, _, opened = gateway
    other = client.post("/v1/sessions", json={}, headers={"authorization": f"Bearer {KEY}"}).json()
    foreign = _owner(client, "POST", f"/v1/sessions/{other['id']}/links", json={"mode": "view"})
    shape = 'the first message must be {"type": "auth", "credential": "<link secret, API key or session token>"}'
    assert _refused(client, session_id, _auth("nope")) == (4401, "that API key or token is not valid")
    assert _refused(client, session_id, "not json") == (4401, shape[:120])
    assert _refused(client, session_id, _auth(foreign["url"].split("#link=")[1])) == (
        4403,
        "this viewer link is for another session",
    )
    assert _refused(client, session_id, _auth(OTHER_KEY))[0] == 4403
    assert _refused(client, "ses_0000000000000000", _auth(KEY)) == (4404, "no session ses_0000000000000000")
    monkeypatch.setattr(live_module, "AUTH_TIMEOUT_S", 0.05)
    assert _refused(client, session_id, None) == (4401, "no auth message within 0.05 s of the upgrade")
    assert opened == []  # nothing refused reached the controller


def test_an_auth_message_over_its_limit_is_refused_before_it_is_read(
    gateway: tuple[TestClient, str, str, list[str]],
) -> None:
    client, session_id, token, opened = gateway
    padded = json.dumps({"type": "auth", "credential": token, "pad": "x" * live_module.AUTH_MAX_BYTES})
    assert _refused(client, session_id, padded) == (
        1009,
        f"the auth message is at most {live_module.AUTH_MAX_BYTES} bytes",
    )
    assert opened == []


def test_sockets_waiting_to_authenticate_are_capped_and_the_oldest_makes_way(
    gateway: tuple[TestClient, str, str, list[str]],
) -> None:
    """Sockets that never send their credential push each other out, never a viewer that sends it."""
    client, session_id, token, opened = gateway
    slots = live_module.AuthSlots(2)
    client.app.state.live_auth_slots = slots  # type: ignore[attr-defined]
    path = f"/v1/sessions/{session_id}/live"
    with client.websocket_connect(path) as oldest, client.websocket_connect(path) as newer:
        with client.websocket_connect(path) as viewer:  # the third: the oldest waiting is dropped
            with pytest.raises(WebSocketDisconnect) as dropped:
                oldest.receive_text()
            assert (dropped.value.code, dropped.value.reason) == (
                1013,
                "too many live streams waiting to authenticate; the oldest waiting is dropped",
            )
            viewer.send_text(_auth(token))
            assert viewer.receive_text() == HELLO
            viewer.send_text(BYE)
        assert slots.free == 1  # the viewer's place given back once it authenticated; newer still waits
        newer.send_text(_auth(token))
        assert newer.receive_text() == HELLO
        newer.send_text(BYE)
    assert len(opened) == 2 and slots.free == 2


def test_only_the_gateway_s_own_pages_may_open_the_stream(gateway: tuple[TestClient, str, str, list[str]]) -> None:
    client, session_id, token, opened = gateway
    path = f"/v1/sessions/{session_id}/live"
    foreign = client.websocket_connect(path, headers={"origin": "https://allowed.test"})
    with foreign as ws, pytest.raises(WebSocketDisconnect) as closed:
        ws.receive_text()
    assert closed.value.code == 4403
    with client.websocket_connect(path, headers={"origin": "http://testserver"}) as ws:  # the viewer page
        ws.send_text(_auth(token))
        assert ws.receive_text() == HELLO
        ws.send_text(BYE)
    assert len(opened) == 1


def test_a_controlling_stream_and_its_messages_keep_the_session_active(
    gateway: tuple[TestClient, str, str, list[str]],
) -> None:
    client, session_id, token, _ = gateway
    session = client.app.state.manager.get(session_id)  # type: ignore[attr-defined]
    session.last_activity_at = 0.0
    with client.websocket_connect(f"/v1/sessions/{session_id}/live") as ws:
        ws.send_text(_auth(KEY))  # the owner's key controls
        assert ws.receive_text() == HELLO
        assert ws.receive_bytes() == FRAME
        assert session.in_flight == 1  # driving, even between inputs, is no idleness
        assert session.last_activity_at == 0.0
        ws.send_text('{"type":"take","seq":1}')
        assert ws.receive_text() == '{"type":"take","seq":1}'
        assert session.last_activity_at > 0.0
        ws.send_text(BYE)
        with pytest.raises(WebSocketDisconnect):
            ws.receive_text()
    assert session.in_flight == 0
    with client.websocket_connect(f"/v1/sessions/{session_id}/live") as ws:
        ws.send_text(_auth(token))  # the agent only watches: its open stream is not activity
        assert ws.receive_text() == HELLO
        assert session.in_flight == 0
        ws.send_text(BYE)


def test_a_link_stream_whose_use_was_not_kept_is_not_left_counted(
    gateway: tuple[TestClient, str, str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, session_id, _, opened = gateway
    link = _owner(client, "POST", f"/v1/sessions/{session_id}/links", json={"mode": "view"})
    book = client.app.state.manager.links  # type: ignore[attr-defined]

    def unwritable(session_id: str, saved: object) -> None:
        raise OSError("the disk is full")

    monkeypatch.setattr(book, "_save", unwritable)
    with pytest.raises(OSError), client.websocket_connect(f"/v1/sessions/{session_id}/live") as ws:
        ws.send_text(_auth(link["url"].split("#link=")[1]))
        ws.receive_text()
    assert book.streams(link["id"]) == 0 and opened == []
