"""The live stream's wire: viewer messages parsed and checked, and WS /v1/live over a desktop of stand-in parts."""

from __future__ import annotations

import asyncio
import json
import warnings
from typing import Any

import pytest

from corral.contracts import auth
from corral.errors import ActionError
from corral.protocol import actions as a
from corral.protocol.geometry import Size
from corral.sandbox.app import create_app
from corral.sandbox.control.live import LiveView
from corral.sandbox.control.viewers import MAX_MESSAGE_BYTES, HumanInput, Input, Refused, Release, Take, Viewers, parse
from corral.sandbox.desktop import Desktop
from corral.sandbox.display.xcapture import Frame
from corral.sandbox.settings import ControllerSettings

from ..desktop_fake import Parts, fake_desktop, settled

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette's note about httpx, on import
    from starlette.testclient import TestClient, WebSocketTestSession
    from starlette.websockets import WebSocketDisconnect

SCREEN = Size(1280, 800)
SECRET = auth.new_secret()
VIEWER = "human:lnk_3kq9x0a1b2c4"


# -- parsing


def test_take_release_and_input_are_read() -> None:
    assert parse('{"type": "take", "seq": 1}', SCREEN) == Take(1)
    assert parse('{"type": "release", "seq": 2, "note": "logged in"}', SCREEN) == Release(2, "logged in")
    assert parse('{"type": "release", "seq": 3}', SCREEN) == Release(3, None)
    got = parse('{"type": "input", "seq": 4, "action": {"type": "click", "x": 10, "y": 20}}', SCREEN)
    assert isinstance(got, Input) and isinstance(got.action, a.Click) and (got.action.x, got.action.y) == (10, 20)
    typed = parse('{"type": "input", "seq": 5, "action": {"type": "type", "text": "pasted"}}', SCREEN)
    assert isinstance(typed, Input) and isinstance(typed.action, a.Type) and typed.action.text == "pasted"


def _refused(raw: str) -> Refused:
    refused = parse(raw, SCREEN)
    assert isinstance(refused, Refused)
    return refused


@pytest.mark.parametrize(
    ("raw", "seq", "code", "field"),
    [
        ("not json", None, "invalid_json", None),
        ("[1]", None, "invalid_request", None),
        ('{"type": "take", "seq": -1}', None, "invalid_field", "seq"),
        ('{"type": "take", "seq": true}', None, "invalid_field", "seq"),
        ('{"seq": 1}', 1, "missing_field", "type"),
        ('{"type": "dance", "seq": 2}', 2, "invalid_field", "type"),
        ('{"type": "release", "seq": 3, "note": 5}', 3, "invalid_field", "note"),
        ('{"type": "input", "seq": 4}', 4, "missing_field", "action"),
        ('{"type": "input", "seq": 5, "action": {"type": "fly"}}', 5, "unknown_action", "action.type"),
        ('{"type": "input", "seq": 6, "action": {"type": "navigate", "url": "https://a.test/"}}', 6, "forbidden",
         "action.type"),
        ('{"type": "input", "seq": 7, "action": {"type": "exec", "command": "id"}}', 7, "forbidden", "action.type"),
        ('{"type": "input", "seq": 8, "action": {"type": "click", "x": 5000, "y": 1}}', 8, "out_of_bounds", "action.x"),
        ('{"type": "input", "seq": 9, "action": {"type": "click", "x": 1, "y": 1, "bogus": 1}}', 9, "unknown_field",
         "action.bogus"),
        ('{"type": "input", "seq": 10, "action": {"type": "key", "keys": "nosuchkey"}}', 10, "unknown_key",
         "action.keys"),
    ],
)  # fmt: skip
def test_a_bad_message_is_refused_with_the_protocols_code_and_field(
    raw: str, seq: int | None, code: str, field: str | None
) -> None:
    refused = _refused(raw)
    assert refused.seq == seq
    assert refused.error.code == code
    assert refused.error.field == field


def test_every_human_input_type_is_accepted() -> None:
    samples: dict[str, dict[str, Any]] = {
        "move": {"x": 1, "y": 1},
        "mouse_down": {},
        "mouse_up": {},
        "click": {"x": 1, "y": 1},
        "scroll": {"x": 1, "y": 1, "direction": "down"},
        "key": {"keys": "ctrl+a"},
        "type": {"text": "hi"},
    }
    for model in a.HUMAN_INPUT:
        kind = a.ACTION_TYPES[list(a.ACTIONS.values()).index(model)]
        got = parse(
            '{"type": "input", "seq": 1, "action": ' + json.dumps({"type": kind, **samples[kind]}) + "}",
            SCREEN,
        )
        assert isinstance(got, Input) and isinstance(got.action, model)


# -- the route, over stand-in parts


class StillScreen:
    async def changed_frame(self, last: bytearray) -> Frame | None:
        if last:
            return None
        last[:] = b"\x00\x00\x00\x00"
        return Frame(1, 1, 4, bytes(last))


async def _jpeg(frame: Frame) -> bytes:
    return b"\xff\xd8frame"


async def _never(seconds: float) -> None:
    await asyncio.Event().wait()  # one grab per stream opening is all these tests need


class Kept:
    """Stands in for the Recorder: keeps the events."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def arrived(self) -> int:
        return len(self.events) + 1

    async def before_action(self) -> None:
        return None

    def record(self, event: dict[str, Any]) -> None:
        self.events.append(event)


class Reported:
    """Stands in for the ActionReporter."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str | None]] = []

    async def started(self, action_id: str, actor: str | None = None) -> None:
        self.calls.append(("started", action_id, actor))

    async def ended(self, action_id: str, actor: str | None = None) -> None:
        self.calls.append(("ended", action_id, actor))


def _viewers() -> tuple[Viewers, Desktop]:
    desktop = fake_desktop(Parts())
    return Viewers(desktop, LiveView(StillScreen(), _jpeg, sleep=_never), HumanInput(desktop, None, None)), desktop


def _human_in_control() -> tuple[HumanInput, Desktop, Parts, Reported]:
    """Human input reported to a fake proxy (no recorder), on a desktop whose lease a viewer holds."""
    parts = Parts()
    desktop = fake_desktop(parts)
    reported = Reported()
    humans = HumanInput(desktop, reported, None)  # type: ignore[arg-type]
    desktop.lease.take(VIEWER)
    return humans, desktop, parts, reported


def _controller() -> tuple[TestClient, Desktop, Parts, Kept, Reported]:
    app = create_app(ControllerSettings(record=False))
    parts = Parts()
    desktop = fake_desktop(parts)
    kept, reported = Kept(), Reported()
    live = LiveView(StillScreen(), _jpeg, sleep=_never)
    humans = HumanInput(desktop, reported, kept)  # type: ignore[arg-type]
    app.state.verifier = auth.RequestVerifier(SECRET)
    app.state.desktop = desktop
    app.state.viewers = Viewers(desktop, live, humans)
    return TestClient(app), desktop, parts, kept, reported


def _open(client: TestClient, query: str) -> Any:
    return client.websocket_connect(f"/v1/live?{query}", headers=auth.sign(SECRET).headers)


def _hello_and_frame(ws: WebSocketTestSession) -> dict[str, Any]:
    hello: dict[str, Any] = ws.receive_json()
    assert ws.receive_bytes() == b"\xff\xd8frame"
    return hello


def test_a_viewer_gets_hello_then_a_frame() -> None:
    client, *_ = _controller()
    with _open(client, f"viewer={VIEWER}&mode=view") as ws:
        hello = _hello_and_frame(ws)
    assert hello["type"] == "hello" and hello["viewer"] == VIEWER and hello["mode"] == "view"
    assert hello["screen"] == {"width": 1280, "height": 800}
    assert hello["lease"]["holder"] == "agent" and hello["lease"]["help"] is None


def test_view_mode_refuses_take_and_input() -> None:
    client, desktop, parts, *_ = _controller()
    with _open(client, f"viewer={VIEWER}&mode=view") as ws:
        _hello_and_frame(ws)
        ws.send_json({"type": "take", "seq": 1})
        assert ws.receive_json()["error"]["code"] == "forbidden"
        ws.send_json({"type": "input", "seq": 2, "action": {"type": "click", "x": 5, "y": 5}})
        refused = ws.receive_json()
        assert refused["type"] == "error" and refused["seq"] == 2 and refused["error"]["code"] == "forbidden"
    assert desktop.lease.holder.who == "agent" and "button" not in parts.methods("input")


def test_control_mode_takes_sends_input_and_hands_back_with_a_note() -> None:
    client, desktop, parts, kept, reported = _controller()
    with _open(client, f"viewer={VIEWER}&mode=control") as ws:
        _hello_and_frame(ws)
        ws.send_json({"type": "input", "seq": 1, "action": {"type": "click", "x": 5, "y": 5}})
        refused = ws.receive_json()
        assert refused["error"]["code"] == "control_taken" and refused["error"]["holder"] == "agent"
        ws.send_json({"type": "take", "seq": 2})
        pushed = ws.receive_json()
        assert pushed["type"] == "lease" and pushed["lease"]["holder"] == VIEWER
        assert ws.receive_json() == {"type": "ack", "seq": 2}
        ws.send_json({"type": "input", "seq": 3, "action": {"type": "click", "x": 5, "y": 5}})
        assert ws.receive_json() == {"type": "ack", "seq": 3}
        ws.send_json({"type": "input", "seq": 4, "action": {"type": "move", "x": 7, "y": 8}})
        assert ws.receive_json() == {"type": "ack", "seq": 4}
        ws.send_json({"type": "release", "seq": 5, "note": "solved the captcha"})
        assert ws.receive_json()["lease"]["holder"] == "agent"
        assert ws.receive_json() == {"type": "ack", "seq": 5}
    assert ("input", "button", ("left", True, False)) in parts.calls and ("input", "move", (7, 8)) in parts.calls
    handed = desktop.lease.take_hand_back()
    assert handed is not None and handed.by == VIEWER and handed.note == "solved the captcha" and not handed.left
    # Reported to the proxy with the viewer as actor and recorded, the move left out of both.
    ids = [action_id for phase, action_id, actor in reported.calls if phase == "started"]
    assert len(ids) == 1 and all(i.startswith("h") for i in ids)  # the click; a move makes no request
    assert all(actor == VIEWER for _, _, actor in reported.calls)
    [event] = kept.events
    assert event["actor"] == VIEWER and event["dialect"] == "human" and event["ok"] is True
    assert event["native"] == [{"type": "click", "x": 5, "y": 5, "button": "left", "count": 1, "modifiers": []}]
    assert event["request"] == {"action": event["native"][0]} and event["action_id"] == ids[0]


def test_a_stream_closing_while_its_viewer_holds_the_lease_gives_it_back() -> None:
    client, desktop, *_ = _controller()
    with _open(client, f"viewer={VIEWER}&mode=control") as ws:
        _hello_and_frame(ws)
        ws.send_json({"type": "take", "seq": 1})
        ws.receive_json()
        ws.receive_json()
        assert desktop.lease.holder.who == VIEWER
    assert desktop.lease.holder.who == "agent"
    handed = desktop.lease.take_hand_back()
    assert handed is not None and handed.left


def test_a_bad_viewer_or_mode_is_refused_at_the_door() -> None:
    client, *_ = _controller()
    for query in ("viewer=someone&mode=view", f"viewer={VIEWER}&mode=drive", "mode=view"):
        with pytest.raises(WebSocketDisconnect) as closed, _open(client, query) as ws:
            ws.receive_json()
        assert closed.value.code == 1008


def test_the_live_route_is_behind_the_controllers_door() -> None:
    client, *_ = _controller()
    for headers in ({}, {**auth.sign(SECRET).headers, "origin": "http://page.test"}):
        with (
            pytest.raises(WebSocketDisconnect),
            client.websocket_connect(f"/v1/live?viewer={VIEWER}&mode=control", headers=headers) as ws,
        ):
            ws.receive_json()


async def test_shutdown_detaches_every_viewer_and_stops_the_view() -> None:
    viewers, desktop = _viewers()
    viewers.attached(VIEWER)
    viewers.attached(VIEWER)  # two streams of one viewer
    desktop.lease.take(VIEWER)
    stream = viewers.live.open()
    await viewers.close()
    assert desktop.lease.holder.who == "agent" and not viewers.live.polling
    handed = desktop.lease.take_hand_back()
    assert handed is not None and handed.left
    viewers.detached(VIEWER)  # a stream's own end afterwards changes nothing
    assert desktop.lease.holder.who == "agent"
    await stream.close()


def test_one_viewers_second_stream_keeps_the_lease_while_the_first_closes() -> None:
    viewers, desktop = _viewers()
    viewers.attached(VIEWER)
    viewers.attached(VIEWER)
    desktop.lease.take(VIEWER)
    viewers.detached(VIEWER)
    assert desktop.lease.holder.who == VIEWER
    viewers.detached(VIEWER)
    assert desktop.lease.holder.who == "agent"


class FakeSocket:
    """A WebSocket the test feeds and reads (for sessions driven without a server)."""

    def __init__(self) -> None:
        self.incoming: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.texts: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def receive(self) -> dict[str, Any]:
        return await self.incoming.get()

    async def send_text(self, text: str) -> None:
        self.texts.put_nowait(json.loads(text))

    async def send_bytes(self, data: bytes) -> None:
        return None

    def feed(self, message: dict[str, Any]) -> None:
        self.incoming.put_nowait({"type": "websocket.receive", "text": json.dumps(message)})


async def test_input_far_ahead_of_the_desktop_is_refused_not_queued(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("corral.sandbox.control.viewers.MAX_PENDING", 2)
    viewers, desktop = _viewers()
    desktop.lease.take(VIEWER)
    socket = FakeSocket()
    async with desktop.lock:  # an agent's long action holds the desktop
        serving = asyncio.create_task(viewers.serve(socket, VIEWER, "control"))  # type: ignore[arg-type]
        assert (await socket.texts.get())["type"] == "hello"
        for seq in range(1, 5):
            socket.feed({"type": "input", "seq": seq, "action": {"type": "key", "keys": "a"}})
        # Read in one go: two wait in line, the rest are refused at once.
        refused = [await socket.texts.get() for _ in range(2)]
        assert [r["seq"] for r in refused] == [3, 4]
        assert all(r["error"]["code"] == "invalid_request" for r in refused)
    answered = [await socket.texts.get() for _ in range(2)]
    assert answered == [{"type": "ack", "seq": 1}, {"type": "ack", "seq": 2}]
    socket.incoming.put_nowait({"type": "websocket.disconnect"})
    await serving
    assert desktop.lease.holder.who == "agent"


async def test_an_inputs_action_stays_in_flight_for_its_tail_then_ends() -> None:
    # A click's page requests reach the proxy after the click returned: they must still be its.
    humans, _, _, reported = _human_in_control()
    await humans.run(VIEWER, a.Click(type="click", x=5, y=5))
    assert [phase for phase, _, _ in reported.calls] == ["started"]
    await humans.close()  # shutdown ends every tail at once
    (started, ended) = reported.calls
    assert ended == ("ended", started[1], VIEWER)


async def test_the_tail_ends_by_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("corral.sandbox.control.viewers.TAIL_S", 0)
    humans, _, _, reported = _human_in_control()
    await humans.run(VIEWER, a.Click(type="click", x=5, y=5))
    for _ in range(3):
        await asyncio.sleep(0)
    assert [phase for phase, _, _ in reported.calls] == ["started", "ended"]
    await humans.close()
    assert len(reported.calls) == 2  # nothing ended twice


def test_the_agent_is_refused_a_control_stream_at_the_door() -> None:
    client, desktop, *_ = _controller()
    with pytest.raises(WebSocketDisconnect) as closed, _open(client, "viewer=agent&mode=control") as ws:
        ws.receive_json()
    assert closed.value.code == 1008
    with _open(client, "viewer=agent&mode=view") as ws:
        assert _hello_and_frame(ws)["viewer"] == "agent"
    desktop.lease.take(VIEWER)
    desktop.lease.release(VIEWER)
    assert desktop.lease.holder.who == "agent"


class ClosingSocket(FakeSocket):
    """A FakeSocket that keeps how it was closed; ``stuck``: it sends nothing after hello (a viewer
    that never reads)."""

    def __init__(self, stuck: bool = False) -> None:
        super().__init__()
        self.closed: tuple[int, str] | None = None
        self._stuck = stuck
        self.gate = asyncio.Event()  # a send waits on it while stuck

    async def send_text(self, text: str) -> None:
        if self._stuck and self.texts.qsize():
            await self.gate.wait()
        await super().send_text(text)

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        self.closed = (code, reason or "")
        self.incoming.put_nowait({"type": "websocket.disconnect"})


async def test_a_viewer_that_sends_without_reading_is_closed_not_queued_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("corral.sandbox.control.viewers.MAX_OUTBOX", 8)
    viewers, _ = _viewers()
    socket = ClosingSocket(stuck=True)
    serving = asyncio.create_task(viewers.serve(socket, VIEWER, "view"))  # type: ignore[arg-type]
    assert (await socket.texts.get())["type"] == "hello"
    socket.texts.put_nowait({"stuck": True})  # from here every send waits: the viewer reads nothing
    for seq in range(100):
        socket.feed({"type": "take", "seq": seq})
    await asyncio.wait_for(serving, 5)
    assert socket.closed is not None and socket.closed[0] == 1008
    socket.gate.set()


async def test_a_message_over_the_limit_closes_the_stream_with_1009() -> None:
    viewers, _ = _viewers()
    socket = ClosingSocket()
    serving = asyncio.create_task(viewers.serve(socket, VIEWER, "control"))  # type: ignore[arg-type]
    assert (await socket.texts.get())["type"] == "hello"
    socket.incoming.put_nowait({"type": "websocket.receive", "bytes": b"x" * (MAX_MESSAGE_BYTES + 1)})
    await asyncio.wait_for(serving, 5)
    assert socket.closed is not None and socket.closed[0] == 1009


async def test_a_lease_change_while_hello_is_sent_is_not_missed() -> None:
    viewers, desktop = _viewers()

    class SlowHello(ClosingSocket):
        async def send_text(self, text: str) -> None:
            if json.loads(text)["type"] == "hello":
                desktop.lease.take(VIEWER)  # a human takes it while hello is on its way
            await super().send_text(text)

    socket = SlowHello()
    serving = asyncio.create_task(viewers.serve(socket, "human:lnk_otherviewer1", "view"))  # type: ignore[arg-type]
    hello_sent = await socket.texts.get()
    assert hello_sent["type"] == "hello" and hello_sent["lease"]["holder"] == "agent"
    changed = await asyncio.wait_for(socket.texts.get(), 5)
    assert changed == {"type": "lease", "lease": desktop.lease.state().view().wire()}
    assert changed["lease"]["holder"] == VIEWER
    socket.incoming.put_nowait({"type": "websocket.disconnect"})
    await serving


async def test_no_input_runs_and_no_tail_starts_once_shutdown_began() -> None:
    humans, _, parts, reported = _human_in_control()
    await humans.close()
    with pytest.raises(ActionError):
        await humans.run(VIEWER, a.Click(type="click", x=5, y=5))
    assert reported.calls == [] and not parts.methods("input") and not humans.tailing


async def test_an_input_running_when_shutdown_begins_ends_at_once() -> None:
    humans, desktop, _, reported = _human_in_control()
    async with desktop.lock:
        running = asyncio.create_task(humans.run(VIEWER, a.Click(type="click", x=5, y=5)))
        await settled(lambda: bool(desktop.lock.waiting))
        closing = asyncio.create_task(humans.close())
        await asyncio.sleep(0)
    with pytest.raises(ActionError):
        await running  # refused once it got the lock: the controller is going away
    await closing
    assert reported.calls == [] and not humans.tailing


async def test_a_move_is_not_reported_to_the_proxy() -> None:
    humans, _, parts, reported = _human_in_control()
    await humans.run(VIEWER, a.Move(type="move", x=3, y=4))
    assert ("input", "move", (3, 4)) in parts.calls
    assert reported.calls == [] and not humans.tailing
    await humans.close()


def test_a_message_nested_past_the_parser_s_recursion_is_invalid_json() -> None:
    refused = parse("[" * 100_000 + "]" * 100_000, Size(1280, 800))
    assert isinstance(refused, Refused) and refused.error.code == "invalid_json"
