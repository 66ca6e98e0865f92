"""The controller's routes that need no X server: the error body is the gateway's shape."""

from __future__ import annotations

import asyncio
import json
import warnings
from typing import Any

import pytest

from corral.errors import error_body
from corral.sandbox import auth
from corral.sandbox.app import Connection, create_app
from corral.sandbox.dispatch import Incoming
from corral.sandbox.settings import ControllerSettings

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette's note about httpx, on import
    from starlette.testclient import TestClient

SECRET = auth.new_secret()


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


class _Dispatcher:
    """Reads ``{"id", "apart"}``; a request with ``"hold"`` runs until a later one says ``release``."""

    def __init__(self) -> None:
        self.released = asyncio.Event()

    def read(self, raw: str) -> Incoming:
        request = json.loads(raw)
        return Incoming(request, request["id"], None, None, 0.0, 0.0)

    async def run(self, incoming: Incoming, emit: Any) -> dict[str, Any]:
        request = incoming.request
        if request.get("release"):
            self.released.set()
        if request.get("hold"):
            await emit({"event": "output", "data": "running"})
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
        [{"event": "output", "data": "running"}, {"ok": True, "id": 2}, {"ok": True, "id": 3}], key=str
    )
    socket.incoming.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(serving, 5)


async def test_commands_cancelled_at_the_end_of_a_connection_have_finished_when_serve_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Incoming, "apart", property(lambda self: self.request.get("apart", False)))
    cleaning, cleaned = asyncio.Event(), asyncio.Event()

    class Cleaning(_Dispatcher):
        async def run(self, incoming: Incoming, emit: Any) -> dict[str, Any]:
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
