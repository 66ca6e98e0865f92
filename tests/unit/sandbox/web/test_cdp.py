"""The controller's CDP relay at its seams: the upgrade's query, the activity window reported to the
proxy, and what the relay answers itself (refusals, control_taken, no CDP at all) against what it
passes to Chromium; its recording events."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from starlette.datastructures import QueryParams

from corral.contracts import cdprules
from corral.errors import ActionError, ErrorCode
from corral.sandbox.control.lease import ControlLease
from corral.sandbox.web import cdpturn
from corral.sandbox.web.cdp import ActivityWindow, CdpQuery, CdpRelay, LastPage, Relays, response_of


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
    lease.take("cdp:cdp_000000aa")  # another connection's exclusive hold: this one reads
    messages = [
        json.dumps({"id": 1, "method": "Browser.crash"}),
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
        "error": {"code": -32001, "message": "control_taken: held by cdp:cdp_000000aa since 100.0"},
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
            "method": "Browser.crash",
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


async def test_a_window_waits_for_its_own_answers_and_never_outlives_its_cap() -> None:
    reporter = Reporter()
    window = ActivityWindow(reporter, "cdp_00000002", "cdp:cdp_00000002", quiet_s=0, longest_s=3600)  # type: ignore[arg-type]
    await window.command(("S", 1))
    await window.command((None, 1))
    window.response(("T", 1))  # another session's answer, and an answer to nothing: not ours
    window.response((None, 9))
    window.response(("S", 1))
    await asyncio.sleep(0)  # the closer runs: one command still waits
    assert reporter.calls == [("start", "c1.cdp_00000002", "cdp:cdp_00000002")]
    window.response((None, 1))
    await reporter.over.wait()
    assert reporter.calls[-1] == ("end", "c1.cdp_00000002", "cdp:cdp_00000002")

    capped = Reporter()
    never = ActivityWindow(capped, "cdp_00000003", "cdp:cdp_00000003", quiet_s=0, longest_s=0)  # type: ignore[arg-type]
    await never.command((None, 1))  # Chromium never answers it
    await capped.over.wait()
    assert capped.calls[-1] == ("end", "c1.cdp_00000003", "cdp:cdp_00000003")
    never.response((None, 1))  # a late answer belongs to no window
    await never.command((None, 2))
    assert never.action_id == "c2.cdp_00000003"
    await never.close()


@pytest.mark.parametrize(
    ("frame", "answered"),
    [
        ('{"id":12,"result":{}}', (None, 12)),
        (b'{"id":12,"result":{"sessionId":"A"}}', (None, 12)),  # attachToTarget's answer: not a session's
        ('{"id":3,"result":{"data":"' + "x" * 1000 + '"},"sessionId":"4F2A"}', ("4F2A", 3)),
        ('{"method":"Page.loadEventFired","params":{},"sessionId":"4F2A"}', None),
    ],
)
def test_a_response_is_named_by_its_id_and_session(frame: str | bytes, answered: tuple[str | None, int] | None) -> None:
    assert response_of(frame) == answered


async def test_what_reaches_chromium_is_what_was_checked() -> None:
    messages = [
        '{"id":1,"method":"Page.enable","method":"Browser.close"}',  # which one would Chromium run?
        '{"id":2, "method" : "Page.enable", "sessionId":"S", "smuggled":{"method":"Browser.close"}}',
    ]
    client = Client(messages)
    client._incoming.insert(0, {"type": "websocket.receive", "bytes": b'{"id":9,"method":"Browser.close"}'})
    chromium = Chromium(client, expected=1)
    query = CdpQuery("cdp_0000000d", False, None)
    relay = CdpRelay(client, query, ControlLease(), None, None, ActivityWindow(None, query.conn, query.actor))  # type: ignore[arg-type]
    await relay.serve(chromium)  # type: ignore[arg-type]
    assert chromium.received == [{"id": 2, "method": "Page.enable", "sessionId": "S"}]
    binary, repeated = (m for m in client.sent if m.get("id") != 2)
    assert binary["id"] is None and "text frame" in binary["error"]["message"]  # a binary frame is not read
    assert repeated["id"] == 1 and "repeated keys" in repeated["error"]["message"]  # the client waits for its id
    assert binary["error"]["code"] == repeated["error"]["code"] == -32600


async def test_a_command_over_the_cap_closes_the_connection_unread() -> None:
    big = json.dumps(
        {"id": 1, "method": "Runtime.evaluate", "params": {"expression": "x" * cdprules.CDP_MAX_COMMAND_BYTES}}
    )
    client = Client([big, json.dumps({"id": 2, "method": "Page.enable"})])
    chromium = Chromium(client, expected=1)
    query = CdpQuery("cdp_0000000e", False, None)
    relay = CdpRelay(client, query, ControlLease(), None, None, ActivityWindow(None, query.conn, query.actor))  # type: ignore[arg-type]
    await relay.serve(chromium)  # type: ignore[arg-type]
    assert chromium.received == [] and client.closed_with == 1009


async def test_a_non_holder_only_reads_while_another_connection_holds_the_lease() -> None:
    lease = ControlLease(clock=lambda: 100.0)
    lease.take("cdp:cdp_000000aa")
    acting = [
        {
            "id": 1,
            "method": "Runtime.compileScript",
            "params": {"expression": "1", "sourceURL": "", "persistScript": True},
        },
        {"id": 2, "method": "DOM.focus", "params": {"nodeId": 1}},
        {"id": 3, "method": "Page.setDocumentContent", "params": {"frameId": "F", "html": "<p>"}},
        {"id": 4, "method": "Emulation.setDeviceMetricsOverride", "params": {"width": 1}},
    ]
    reading = {"id": 5, "method": "DOM.querySelector", "params": {"nodeId": 1, "selector": "p"}}
    client = Client([json.dumps(m) for m in [*acting, reading]])
    chromium = Chromium(client, expected=1)
    query = CdpQuery("cdp_0000000f", False, None)
    relay = CdpRelay(client, query, lease, None, None, ActivityWindow(None, query.conn, query.actor))  # type: ignore[arg-type]
    await relay.serve(chromium)  # type: ignore[arg-type]
    assert chromium.received == [reading]
    assert sorted(m["id"] for m in client.sent if m.get("error", {}).get("code") == -32001) == [1, 2, 3, 4]


class Upstream(Chromium):
    """Chromium that never answers nor closes: only the relay's stop ends it."""

    def __init__(self, client: Client) -> None:
        super().__init__(client, expected=-1)
        self.closed = asyncio.Event()

    async def close(self) -> None:
        self.closed.set()


async def test_shutdown_ends_open_connections_before_it_goes_on() -> None:
    relays = Relays()
    lease = ControlLease()
    client = Client([])
    chromium = Upstream(client)
    query = CdpQuery("cdp_00000010", True, None)
    relay = CdpRelay(client, query, lease, None, None, ActivityWindow(None, query.conn, query.actor))  # type: ignore[arg-type]
    detached: list[str] = []
    started = asyncio.Event()

    async def connection() -> None:
        with relays.tracking(relay):
            lease.take(query.actor)
            try:
                started.set()
                await relay.serve(chromium)  # type: ignore[arg-type]
            finally:
                lease.detach(query.actor)
                detached.append(lease.holder.who)

    task = asyncio.create_task(connection())
    await started.wait()
    await relays.close()
    assert detached == ["agent"] and chromium.closed.is_set() and relays.closed
    await task


class Targets:
    """Chromium's /json/list: its pages, and a worker."""

    def __init__(self, *pages: str) -> None:
        self.pages = list(pages)

    async def __call__(self) -> list[dict[str, str]]:
        return [{"id": p, "type": "page"} for p in self.pages] + [{"id": "W", "type": "service_worker"}]


async def test_the_last_page_is_never_closed() -> None:
    targets = Targets("P1", "P2")
    last = LastPage(targets)
    assert not await last.refuses("P1")  # P2 stays
    assert await last.refuses("P2")  # P1 is closing (still listed): P2 is the last
    assert not await last.refuses("W")  # not a page: Chromium answers
    targets.pages = ["P2"]
    assert await last.refuses(None)  # Page.close in a session: whichever page, it is the only one
    targets.pages = ["P2", "P3"]
    assert not await last.refuses(None)


async def test_the_last_page_is_refused_when_devtools_cannot_tell() -> None:
    async def silent() -> list[dict[str, str]]:
        raise ActionError(ErrorCode.BROWSER_UNAVAILABLE, "no answer")

    assert await LastPage(silent).refuses("P1")


class Blank:
    """DevTools' PUT /json/new: a blank page added to ``targets`` (or a failure)."""

    def __init__(self, targets: Targets, fails: bool = False) -> None:
        self.targets, self.fails, self.opened = targets, fails, 0

    async def __call__(self) -> None:
        if self.fails:
            raise ActionError(ErrorCode.BROWSER_UNAVAILABLE, "no answer")
        self.opened += 1
        self.targets.pages.append(f"B{self.opened}")


async def test_the_last_page_closes_once_a_blank_one_stands_beside_it() -> None:
    targets = Targets("P1", "P2")
    blank = Blank(targets)
    last = LastPage(targets, blank)
    assert await last.make_way("P1") and blank.opened == 0  # P2 stays
    assert await last.make_way("P2") and blank.opened == 1  # P1 is closing: a blank tab first
    assert targets.pages == ["P1", "P2", "B1"]
    assert await last.make_way("W") and blank.opened == 1  # not a page: Chromium answers
    targets.pages = ["B1"]
    assert await last.make_way(None) and blank.opened == 2  # an unnamed page when one is left
    assert not await LastPage(Targets("P1"), Blank(Targets(), fails=True)).make_way("P1")
    assert not await LastPage(Targets("P1")).make_way("P1")  # nothing to open a tab with


async def test_closing_the_last_page_opens_a_blank_one_then_lets_the_close_through() -> None:
    closes = [
        json.dumps({"id": n, "method": "Target.closeTarget", "params": {"targetId": p}})
        for n, p in ((1, "P1"), (2, "P2"))
    ]
    client = Client(closes)
    chromium = Chromium(client, expected=2)
    query = CdpQuery("cdp_00000011", False, None)
    window = ActivityWindow(None, query.conn, query.actor)
    targets = Targets("P1", "P2")
    blank = Blank(targets)
    relay = CdpRelay(client, query, ControlLease(), None, None, window, LastPage(targets, blank))  # type: ignore[arg-type]
    await relay.serve(chromium)  # type: ignore[arg-type]
    assert chromium.received == [json.loads(c) for c in closes] and blank.opened == 1
    assert [m["id"] for m in client.sent if "result" in m] == [1, 2]


async def test_page_close_in_a_session_names_the_page_that_session_is_attached_to() -> None:
    client = Live()
    chromium = Scripted()
    query = CdpQuery("cdp_00000012", False, None)
    window = ActivityWindow(None, query.conn, query.actor)
    targets = Targets("P1", "P2")
    last = LastPage(targets, Blank(targets))
    relay = CdpRelay(client, query, ControlLease(), None, None, window, last)  # type: ignore[arg-type]
    serving = asyncio.create_task(relay.serve(chromium))  # type: ignore[arg-type]
    attached = {"sessionId": "S1", "targetInfo": {"targetId": "P1", "type": "page"}, "waitingForDebugger": False}
    await chromium.frames.put(json.dumps({"method": "Target.attachedToTarget", "params": attached}))
    await _until(lambda: client.sent)  # the event reached the client: the relay has read it
    await client.incoming.put(json.dumps({"id": 7, "method": "Page.close", "sessionId": "S1"}))
    await chromium.arrived.wait()
    assert chromium.received == [{"id": 7, "method": "Page.close", "sessionId": "S1"}]
    assert await last.make_way("P2")  # P1 counts as closing: P2 is the last, so a blank tab first
    assert targets.pages == ["P1", "P2", "B1"]
    await client.incoming.put(None)
    await serving


async def test_browser_close_answers_success_and_ends_only_that_connection() -> None:
    lease = ControlLease(clock=lambda: 100.0)
    lease.take("human:ops")  # even in a person's turn: it lets go of everything, touches no page
    client = Client(
        [json.dumps({"id": 4, "method": "Browser.close"}), json.dumps({"id": 5, "method": "Browser.getVersion"})]
    )
    chromium = Chromium(client, expected=99)
    notes = Notes()
    query = CdpQuery("cdp_00000013", False, None)
    relay = CdpRelay(client, query, lease, None, notes, ActivityWindow(None, query.conn, query.actor))  # type: ignore[arg-type]
    await relay.serve(chromium)  # type: ignore[arg-type]
    assert chromium.received == []  # Chromium never heard of it, nor of what came after
    assert client.sent == [{"id": 4, "result": {}}] and client.closed_with == 1000
    assert {
        "event": "cdp",
        "change": "closed",
        "conn": "cdp_00000013",
        "exclusive": False,
        "method": "Browser.close",
    } in notes.events


class Scripted:
    """Chromium's socket driven by the test: what reached it, and frames the test pushes."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.frames: asyncio.Queue[str | None] = asyncio.Queue()
        self.arrived = asyncio.Event()

    async def send(self, frame: str | bytes) -> None:
        self.received.append(json.loads(frame))
        self.arrived.set()

    def __aiter__(self) -> Scripted:
        return self

    async def __anext__(self) -> str:
        frame = await self.frames.get()
        if frame is None:
            raise StopAsyncIteration
        return frame

    async def close(self) -> None:
        await self.frames.put(None)


class Live(Client):
    """A client that sends when the test says so."""

    def __init__(self) -> None:
        super().__init__([])
        self.incoming: asyncio.Queue[str | None] = asyncio.Queue()
        self.got = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        text = await self.incoming.get()
        return {"type": "websocket.disconnect"} if text is None else {"type": "websocket.receive", "text": text}

    async def send_text(self, text: str) -> None:
        await super().send_text(text)
        self.got.set()


async def _until(check: Any) -> None:
    """Lets the relay's tasks run until ``check()`` holds (a bounded number of turns of the loop)."""
    for _ in range(10_000):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError("never came")


async def test_a_persons_take_cuts_events_and_commands_in_flight_and_lets_go_of_sessions() -> None:
    lease = ControlLease(clock=lambda: 100.0)
    client, chromium = Live(), Scripted()
    query = CdpQuery("cdp_00000020", False, None)
    relay = CdpRelay(client, query, lease, None, None, ActivityWindow(None, query.conn, query.actor))  # type: ignore[arg-type]
    serving = asyncio.create_task(relay.serve(chromium))  # type: ignore[arg-type]
    auto = {"autoAttach": True, "waitForDebuggerOnStart": True, "flatten": True}
    await client.incoming.put(json.dumps({"id": 1, "method": "Target.setAutoAttach", "params": auto}))
    await _until(lambda: len(chromium.received) == 1)
    await chromium.frames.put('{"id":1,"result":{}}')
    attached = {"sessionId": "S1", "targetInfo": {"targetId": "T1", "type": "page"}, "waitingForDebugger": False}
    await chromium.frames.put(json.dumps({"method": "Target.attachedToTarget", "params": attached}))
    evaluate = {"expression": "keys()", "awaitPromise": True}
    await client.incoming.put(
        json.dumps({"id": 2, "method": "Runtime.evaluate", "params": evaluate, "sessionId": "S1"})
    )
    await _until(lambda: len(chromium.received) == 2 and len(client.sent) == 2)

    lease.take("human:lnk_aaaaaaaaaaaa")
    await _until(lambda: len(chromium.received) == 4)
    assert [(c["method"], c["params"]) for c in chromium.received[2:]] == [
        ("Target.setAutoAttach", {"autoAttach": False, "waitForDebuggerOnStart": False, "flatten": True}),
        ("Target.detachFromTarget", {"sessionId": "S1"}),
    ]
    assert all(c["id"] > 2_000_000_000 for c in chromium.received[2:])
    cut = {
        "id": 2,
        "sessionId": "S1",
        "error": {"code": -32001, "message": "control_taken: held by human:lnk_aaaaaaaaaaaa since 100.0"},
    }
    await _until(lambda: cut in client.sent)
    # Chromium's late answer to the cut command, its events, the answers to the relay's own: none pass.
    for frame in (
        '{"id":2,"result":{"result":{"value":"hunter2"}},"sessionId":"S1"}',
        '{"method":"Network.requestWillBeSent","params":{"postData":"password=hunter2"},"sessionId":"S1"}',
        json.dumps({"id": chromium.received[2]["id"], "result": {}}),
        '{"method":"Target.detachedFromTarget","params":{"sessionId":"S1"}}',
    ):
        await chromium.frames.put(frame)
    await _until(lambda: client.sent[-1].get("method") == "Target.detachedFromTarget")
    assert "hunter2" not in json.dumps(client.sent)
    await client.incoming.put(json.dumps({"id": 3, "method": "Network.enable", "sessionId": "S1"}))
    await _until(lambda: client.sent[-1].get("id") == 3)
    assert client.sent[-1]["error"]["code"] == -32001

    lease.release("human:lnk_aaaaaaaaaaaa")
    await _until(lambda: len(chromium.received) == 5)
    assert (chromium.received[4]["method"], chromium.received[4]["params"]) == ("Target.setAutoAttach", auto)
    await chromium.frames.put('{"method":"Network.requestWillBeSent","params":{},"sessionId":"S2"}')
    await _until(lambda: client.sent[-1].get("method") == "Network.requestWillBeSent")
    await client.incoming.put(None)
    await serving


async def test_a_page_socket_is_closed_at_a_persons_take() -> None:
    lease = ControlLease()
    client, chromium = Live(), Scripted()
    query = CdpQuery("cdp_00000021", False, "PAGE-1")
    relay = CdpRelay(client, query, lease, None, None, ActivityWindow(None, query.conn, query.actor))  # type: ignore[arg-type]
    serving = asyncio.create_task(relay.serve(chromium))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    lease.take("human:lnk_aaaaaaaaaaaa")
    async with asyncio.timeout(5):
        await serving
    assert client.closed_with == 4409


async def test_an_exclusive_holder_keeps_everything_while_it_holds_the_lease() -> None:
    lease = ControlLease()
    client, chromium = Live(), Scripted()
    query = CdpQuery("cdp_00000022", True, None)
    lease.take(query.actor)
    relay = CdpRelay(client, query, lease, None, None, ActivityWindow(None, query.conn, query.actor))  # type: ignore[arg-type]
    serving = asyncio.create_task(relay.serve(chromium))  # type: ignore[arg-type]
    await client.incoming.put(json.dumps({"id": 1, "method": "Network.enable", "sessionId": "S1"}))
    await _until(lambda: len(chromium.received) == 1)
    await chromium.frames.put('{"method":"Network.requestWillBeSent","params":{},"sessionId":"S1"}')
    await _until(lambda: client.sent and client.sent[-1].get("method") == "Network.requestWillBeSent")
    await client.incoming.put(None)
    await serving
    lease.detach(query.actor)


class Compact(Chromium):
    """Chromium's answers as Chromium writes them (no spaces, the session last), which the relay reads."""

    async def send(self, frame: str | bytes) -> None:
        command = json.loads(frame)
        self.received.append(command)
        answer = {
            "id": command["id"],
            "result": {},
            **({"sessionId": command["sessionId"]} if "sessionId" in command else {}),
        }
        await self._answers.put(json.dumps(answer, separators=(",", ":")))


async def test_a_screenshot_brings_its_tab_to_the_front_first_where_the_connection_may_act() -> None:
    capture = {"id": 9, "method": "Page.captureScreenshot", "params": {"format": "png"}, "sessionId": "S"}
    client = Client([json.dumps(capture)])
    chromium = Compact(client, expected=2)
    query = CdpQuery("cdp_00000014", False, None)
    relay = CdpRelay(client, query, ControlLease(), None, None, ActivityWindow(None, query.conn, query.actor))  # type: ignore[arg-type]
    await relay.serve(chromium)  # type: ignore[arg-type]
    front, shot = chromium.received
    assert (front["method"], front["sessionId"], front["params"]) == ("Page.bringToFront", "S", {})
    assert front["id"] >= cdpturn.OWN_IDS and shot == capture
    assert client.sent == [{"id": 9, "result": {}, "sessionId": "S"}]  # the relay's own answer is not the client's
    # Another connection holds the lease: this one may read (the screenshot) but not act on the tabs.
    lease = ControlLease()
    lease.take("cdp:cdp_000000bb")
    client = Client([json.dumps(capture)])
    chromium = Chromium(client, expected=1)
    relay = CdpRelay(client, query, lease, None, None, ActivityWindow(None, query.conn, query.actor))  # type: ignore[arg-type]
    await relay.serve(chromium)  # type: ignore[arg-type]
    assert chromium.received == [capture]
