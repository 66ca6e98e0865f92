"""The controller's CDP relay at its seams: the upgrade's query, the activity window reported to the
proxy, and what the relay answers itself (refusals, control_taken, no CDP at all) against what it
passes to Chromium; its recording events."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from starlette.datastructures import QueryParams

from corral.errors import ActionError
from corral.sandbox.cdp import ActivityWindow, CdpQuery, CdpRelay
from corral.sandbox.lease import ControlLease


def test_the_query_names_the_connection_and_what_it_asks() -> None:
    query = CdpQuery.of(QueryParams("conn=cdp_0a1b2c3d&exclusive=1&target=A1B2-C3"))
    assert query == CdpQuery("cdp_0a1b2c3d", True, "A1B2-C3") and query.actor == "cdp:cdp_0a1b2c3d"
    made = CdpQuery.of(QueryParams(""))
    assert made.conn.startswith("cdp_") and made.exclusive is False and made.target is None


@pytest.mark.parametrize(
    ("query", "field"), [("conn=a%20b", "conn"), ("exclusive=yes", "exclusive"), ("target=../x", "target")]
)
def test_a_bad_query_names_its_field(query: str, field: str) -> None:
    with pytest.raises(ActionError) as refused:
        CdpQuery.of(QueryParams(query))
    assert refused.value.field == field


class Reporter:
    """What the proxy was told; ``over`` is set at each window's end."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str | None]] = []
        self.over = asyncio.Event()

    async def started(self, action_id: str, actor: str | None = None) -> None:
        self.calls.append(("start", action_id, actor))

    async def ended(self, action_id: str, actor: str | None = None) -> None:
        self.calls.append(("end", action_id, actor))
        self.over.set()


async def test_one_window_per_connection_from_its_first_command_to_its_last_answer() -> None:
    reporter = Reporter()
    window = ActivityWindow(reporter, "cdp_00000001", "cdp:cdp_00000001", quiet_s=0)  # type: ignore[arg-type]
    await window.command((None, 1))
    await window.command(("S", 1))  # the window is open: no second action
    assert window.action_id == "c1.cdp_00000001"
    window.response((None, 1))
    window.response(("S", 1))
    await reporter.over.wait()
    assert reporter.calls == [
        ("start", "c1.cdp_00000001", "cdp:cdp_00000001"),
        ("end", "c1.cdp_00000001", "cdp:cdp_00000001"),
    ]
    await window.command((None, 2))  # the next command opens the next window
    assert window.action_id == "c2.cdp_00000001"
    await window.close()
    assert reporter.calls[-1] == ("end", "c2.cdp_00000001", "cdp:cdp_00000001")


class Client:
    """The client's side of the WebSocket: what it sends, then a disconnect; what it was sent."""

    def __init__(self, messages: list[str]) -> None:
        self._incoming = [{"type": "websocket.receive", "text": m} for m in messages]
        self.sent: list[dict[str, Any]] = []
        self.done = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        if self._incoming:
            return self._incoming.pop(0)
        await self.done.wait()
        return {"type": "websocket.disconnect"}

    async def send_text(self, text: str) -> None:
        self.sent.append(json.loads(text))

    async def send_bytes(self, data: bytes) -> None:
        self.sent.append(json.loads(data))

    async def close(self, code: int = 1000) -> None:
        self.closed_with = code


class Chromium:
    """Chromium's socket: what reached it; it answers each command with an empty result."""

    def __init__(self, client: Client, expected: int) -> None:
        self.received: list[dict[str, Any]] = []
        self._answers: asyncio.Queue[str] = asyncio.Queue()
        self._client, self._expected = client, expected

    async def send(self, frame: str | bytes) -> None:
        command = json.loads(frame)
        self.received.append(command)
        await self._answers.put(json.dumps({"id": command["id"], "result": {}}))

    def __aiter__(self) -> Chromium:
        return self

    async def __anext__(self) -> str:
        answer = await self._answers.get()
        if len(self.received) == self._expected and self._answers.empty():
            self._client.done.set()  # every command answered: the client goes
        return answer

    async def close(self) -> None:
        return None


class Notes:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def note(self, event: dict[str, Any]) -> None:
        self.events.append(event)


async def test_the_relay_answers_refusals_itself_and_passes_the_rest() -> None:
    lease = ControlLease(clock=lambda: 100.0)
    lease.take("human:lnk_aaaaaaaaaaaa")
    messages = [
        json.dumps({"id": 1, "method": "Browser.close"}),
        json.dumps({"id": 2, "method": "Page.navigate", "params": {"url": "https://a.test/"}, "sessionId": "S"}),
        json.dumps({"id": 3, "method": "Page.captureScreenshot", "sessionId": "S"}),
        "not json",
    ]
    client = Client(messages)
    chromium = Chromium(client, expected=1)
    notes = Notes()
    query = CdpQuery("cdp_0000000a", False, None)
    window = ActivityWindow(None, query.conn, query.actor)
    relay = CdpRelay(client, query, lease, None, notes, window)  # type: ignore[arg-type]
    await relay.serve(chromium)  # type: ignore[arg-type]
    assert chromium.received == [{"id": 3, "method": "Page.captureScreenshot", "sessionId": "S"}]
    by_id = {m.get("id"): m for m in client.sent}
    assert by_id[1]["error"]["message"].endswith("(rule browser_lifecycle)")
    assert by_id[2] == {
        "id": 2,
        "sessionId": "S",
        "error": {"code": -32001, "message": "control_taken: held by human:lnk_aaaaaaaaaaaa since 100.0"},
    }
    assert by_id[3] == {"id": 3, "result": {}}
    assert by_id[None]["error"]["code"] == -32600
    assert notes.events == [
        {"event": "cdp", "change": "connected", "conn": "cdp_0000000a", "exclusive": False},
        {
            "event": "cdp",
            "change": "refused",
            "conn": "cdp_0000000a",
            "exclusive": False,
            "method": "Browser.close",
            "rule": "browser_lifecycle",
        },
        {"event": "cdp", "change": "disconnected", "conn": "cdp_0000000a", "exclusive": False},
    ]


async def test_the_lease_holder_and_anyone_beside_the_agent_drive() -> None:
    lease = ControlLease()
    lease.take("cdp:cdp_0000000b")
    navigate = json.dumps({"id": 1, "method": "Page.navigate", "params": {"url": "https://a.test/"}})
    for conn, lease_now in (("cdp_0000000b", lease), ("cdp_0000000c", ControlLease())):
        client = Client([navigate])
        chromium = Chromium(client, expected=1)
        query = CdpQuery(conn, False, None)
        relay = CdpRelay(client, query, lease_now, None, None, ActivityWindow(None, conn, query.actor))  # type: ignore[arg-type]
        await relay.serve(chromium)  # type: ignore[arg-type]
        assert [c["method"] for c in chromium.received] == ["Page.navigate"]
        assert client.sent == [{"id": 1, "result": {}}]
