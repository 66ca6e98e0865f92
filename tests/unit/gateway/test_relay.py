"""The WebSocket relay with a fake agent and a fake controller: frames pass unchanged, failures are
counted by their code whatever the length of the request's id."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.websockets import WebSocketDisconnect
from websockets.exceptions import ConnectionClosed

from corral.errors import ActionError, ErrorCode
from corral.gateway import relay as relay_module
from corral.gateway.metrics import Metrics
from corral.gateway.relay import cancel_all, raise_unexpected, relay
from corral.protocol import reply


class Agent:
    """The agent's side (a starlette WebSocket): sends ``messages``, then leaves once it has read
    ``expect`` frames (by default as many as it sent)."""

    def __init__(self, messages: list[str], expect: int | None = None) -> None:
        self._messages = list(messages)
        self._expect = len(messages) if expect is None else expect
        self.received: list[str | bytes] = []
        self._answered = asyncio.Event()
        self.closed: tuple[int, str] | None = None

    async def receive(self) -> dict[str, Any]:
        if self._messages:
            return {"type": "websocket.receive", "text": self._messages.pop(0)}
        await self._answered.wait()
        return {"type": "websocket.disconnect", "code": 1000}

    async def _got(self, frame: str | bytes) -> None:
        self.received.append(frame)
        if not self._messages and len(self.received) >= self._expect:
            self._answered.set()

    async def send_text(self, frame: str) -> None:
        await self._got(frame)

    async def send_bytes(self, frame: bytes) -> None:
        await self._got(frame)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.closed = (code, reason)


class Controller:
    """The controller's WebSocket: answers each message with ``answer(message)`` (a frame, or a list
    of frames: a streamed exec's events, then its reply)."""

    def __init__(self, answer: Any) -> None:
        self._answer = answer
        self._frames: asyncio.Queue[str | None] = asyncio.Queue()
        self.sent: list[str | bytes] = []

    async def send(self, message: str | bytes) -> None:
        self.sent.append(message)
        answer = self._answer(message)
        for frame in answer if isinstance(answer, list) else [answer]:
            self._frames.put_nowait(frame)

    async def close(self) -> None:
        self._frames.put_nowait(None)

    def __aiter__(self) -> AsyncIterator[str]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[str]:
        while (frame := await self._frames.get()) is not None:
            yield frame


class Sandbox:
    ws_url = "ws://sandbox.invalid/v1/ws"
    secret = "s" * 64


class Session:
    sandbox = Sandbox()

    def __init__(self) -> None:
        self.ended = asyncio.Event()
        self.touched = 0
        self.in_flight = 0

    def touch(self) -> None:
        self.touched += 1

    def close_reason(self) -> str:
        return "deleted"

    def close_code(self) -> int:
        return 4000


def errors(metrics: Metrics) -> dict[str, float]:
    """Error replies counted, by code."""
    return {
        sample.labels["code"]: sample.value
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.name == "corral_errors_total"
    }


def round_trips(metrics: Metrics) -> tuple[float, float]:
    """How many round trips ``corral_action_seconds{transport="ws"}`` observed, and their sum."""
    found = {
        sample.name: sample.value
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.name.startswith("corral_action_seconds") and sample.labels.get("transport") == "ws"
    }
    return found["corral_action_seconds_count"], found["corral_action_seconds_sum"]


async def run(
    monkeypatch: pytest.MonkeyPatch, messages: list[str], answer: Any, expect: int | None = None
) -> tuple[Agent, Metrics]:
    controller = Controller(answer)

    async def connect_ws(ws_url: str, secret: str) -> Controller:
        assert (ws_url, secret) == (Sandbox.ws_url, Sandbox.secret)
        return controller

    monkeypatch.setattr(relay_module, "connect_ws", connect_ws)
    agent, metrics = Agent(messages, expect), Metrics()
    await relay(agent, Session(), metrics)  # type: ignore[arg-type]
    assert controller.sent == messages  # the agent's frames reach the controller unchanged
    return agent, metrics


def failing(message: str | bytes) -> str:
    request_id = json.loads(message)["id"]
    error = ActionError(ErrorCode.OUT_OF_BOUNDS, "x is off the screen", field="action.x")
    return reply.encode(reply.failure(request_id, error))  # as the controller sends it


@pytest.mark.parametrize("request_id", [7, "short", "r-" + "x" * 300])
async def test_a_failure_is_counted_by_its_code_whatever_the_id(
    monkeypatch: pytest.MonkeyPatch, request_id: object
) -> None:
    message = json.dumps({"id": request_id, "action": {"type": "click", "x": 99999, "y": 1}})
    agent, metrics = await run(monkeypatch, [message], failing)
    assert agent.received == [failing(message)]  # relayed unchanged
    assert errors(metrics) == {"out_of_bounds": 1}


async def test_a_success_counts_no_error(monkeypatch: pytest.MonkeyPatch) -> None:
    message = json.dumps({"id": 1, "action": {"type": "wait", "ms": 0}})
    # A success whose result happens to carry the failure's text (typed by the agent) is no failure.
    answer = '{"ok":true,"id":1,"result":{"text":"\\"ok\\":false"}}'
    agent, metrics = await run(monkeypatch, [message], lambda _: answer)
    assert agent.received == [answer]
    assert errors(metrics) == {}


async def test_output_events_pass_unchanged_and_only_the_reply_ends_the_round_trip(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    message = json.dumps({"id": 3, "action": {"type": "exec", "argv": ["echo", "hi"], "stream": True}})
    events = [
        '{"id":3,"event":"output","stream":"stdout","data":"hi\\n","encoding":"utf-8"}',
        '{"id":3,"event":"output","stream":"stderr","data":"\\"ok\\":false","encoding":"utf-8"}',
    ]
    final = '{"ok":true,"id":3,"result":{"exit_code":0,"stdout":"hi\\n"}}'
    # A fake clock: the request goes at 0, and each frame passed to the agent takes one second.
    clock = [0.0]

    def ticking(frame: str | bytes) -> str | bytes:
        clock[0] += 1
        return frame

    monkeypatch.setattr(relay_module.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(Agent, "send_text", lambda self, frame: self._got(ticking(frame)))
    agent, metrics = await run(monkeypatch, [message], lambda _: [*events, final], expect=3)
    assert agent.received == [*events, final]
    # One round trip, measured when the reply came (after two events: 2 s), not at the first event (0 s).
    assert round_trips(metrics) == (1, 2.0)
    assert errors(metrics) == {}


def test_a_reply_is_told_from_an_event_by_its_first_key() -> None:
    assert relay_module.is_reply('{"ok":true,"id":1}') and relay_module.is_reply(b'{"ok":false,"id":1}')
    assert not relay_module.is_reply('{"id":1,"event":"output","stream":"stdout","data":""}')
    assert not relay_module.is_reply(b'{"id":1,"event":"output"}')


async def test_an_ended_session_closes_the_agent_with_4000_and_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    session, agent, controller = Session(), Agent([]), Controller(failing)

    async def connect_ws(ws_url: str, secret: str) -> Controller:
        session.ended.set()  # deleted while the agent was connecting
        return controller

    monkeypatch.setattr(relay_module, "connect_ws", connect_ws)
    await relay(agent, session, Metrics())  # type: ignore[arg-type]
    assert agent.closed == (4000, "deleted")


async def test_a_sandbox_that_closes_first_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    controller, lost = Controller(failing), []
    controller._frames.put_nowait(None)  # the controller's side closes at once

    async def connect_ws(ws_url: str, secret: str) -> Controller:
        return controller

    async def upstream_lost() -> None:
        lost.append(True)

    monkeypatch.setattr(relay_module, "connect_ws", connect_ws)
    agent = Agent([])
    await relay(agent, Session(), Metrics(), upstream_lost)  # type: ignore[arg-type]
    assert lost == [True] and agent.closed == (1000, "")


async def test_an_unreachable_sandbox_is_a_1011_close(monkeypatch: pytest.MonkeyPatch) -> None:
    async def connect_ws(ws_url: str, secret: str) -> Controller:
        raise OSError("connection refused")

    monkeypatch.setattr(relay_module, "connect_ws", connect_ws)
    agent, metrics = Agent([]), Metrics()
    await relay(agent, Session(), metrics)  # type: ignore[arg-type]
    assert agent.closed == (1011, "the sandbox did not answer: OSError")
    assert errors(metrics) == {"sandbox_unreachable": 1}


async def test_a_round_trip_is_matched_to_its_request_by_id_not_by_order(monkeypatch: pytest.MonkeyPatch) -> None:
    running = json.dumps({"id": "exec-1", "action": {"type": "exec", "argv": ["sleep", "60"]}})
    kill = json.dumps({"action": {"type": "process_kill", "pid": 7}, "id": 2})
    answered = '{"ok":true,"id":2,"result":{"pid":7,"signal":"SIGKILL"}}'
    # The exec goes at 0 s, the kill at 10 s, and the kill's reply (the exec's has not come) at 11 s.
    clock = iter([0.0, 10.0, 11.0])
    monkeypatch.setattr(relay_module.time, "perf_counter", lambda: next(clock))
    agent, metrics = await run(monkeypatch, [running, kill], lambda m: answered if '"id": 2' in m else [], expect=1)
    assert agent.received == [answered]
    assert round_trips(metrics) == (1, 1.0)  # the kill's own second, not 11 s since the exec went


def test_ids_are_keys_read_alike_from_a_request_and_from_the_first_bytes_of_its_reply() -> None:
    big = '{"ok":true,"id":"a\\"b","result":{"image":"' + "A" * 100_000 + '"}}'
    assert relay_module.reply_key(big) == relay_module.request_key('{"action":{},"id":"a\\"b"}') == '"a\\"b"'
    assert relay_module.reply_key(b'{"ok":false,"id":5,"error":{}}') == relay_module.request_key(b'{"id":5}') == "5"
    assert relay_module.request_key('{"id":"5"}') != relay_module.request_key('{"id":5}')
    assert relay_module.request_key("not json") == relay_module.request_key("[1]") == "null"
    assert relay_module.reply_key('{"ok":false,"id":null,"error":{}}') == "null"
    assert relay_module.reply_key('{"ok":true,"result":{},"id":9}') == "9"  # not as written: read whole


async def test_a_vendor_call_and_its_failure_with_the_vendor_result_pass_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    item = {
        "type": "apply_patch_call",
        "id": "apc_04",
        "call_id": "call_07",
        "status": "completed",
        "operation": {"type": "update_file", "path": "/workspace/app.py", "diff": "@@\n-    return 7\n+    return 8\n"},
    }
    message = json.dumps({"id": 35, "openai": item, "acknowledge_safety_checks": True})
    reason = "chunk 1 (diff line 1): these lines were not found in /workspace/app.py:\n    return 7"
    output = {"type": "apply_patch_call_output", "call_id": "call_07", "status": "failed", "output": reason}
    failure = {"ok": False, "id": 35, "error": {"code": "patch_failed", "message": reason}, "result": {"item": output}}
    answer = reply.encode(failure)
    agent, metrics = await run(monkeypatch, [message], lambda _: answer)
    assert agent.received == [answer]
    assert errors(metrics) == {"patch_failed": 1}


LIVE_URL = "ws://sandbox.invalid/v1/live?viewer=human%3Alnk_x&mode=view"


class Transport:
    def __init__(self) -> None:
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


class Hanging:
    """A close that never finishes until ``done`` is set (a socket that stopped draining)."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.done = asyncio.Event()

    async def __call__(self) -> None:
        self.started.set()
        await self.done.wait()


async def revoked_bridge(monkeypatch: pytest.MonkeyPatch, client: Agent, controller: Controller) -> None:
    """A link's relay whose stop fired as it opened (a revoke), closes bounded to a hundredth of a second."""

    async def connect_ws(ws_url: str, secret: str) -> Controller:
        assert ws_url == LIVE_URL
        return controller

    monkeypatch.setattr(relay_module, "connect_ws", connect_ws)
    monkeypatch.setattr(relay_module, "CLOSE_WAIT_S", 0.01)
    revoked = asyncio.Event()
    revoked.set()
    stop = relay_module.Stop(revoked.wait, 4003, lambda: "link revoked")
    await relay_module.bridge(client, Session(), Metrics(), LIVE_URL, stops=[stop])  # type: ignore[arg-type]


async def test_a_stop_closes_the_client_and_the_controller_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    controller_close = Hanging()

    class Slow(Controller):
        async def close(self) -> None:
            await controller_close()
            await super().close()

    class Client(Agent):
        async def close(self, code: int = 1000, reason: str = "") -> None:
            # The controller's close is under way before the client's finishes: neither waits on the other.
            await controller_close.started.wait()
            controller_close.done.set()
            await super().close(code, reason)

    client = Client([], expect=1)
    await revoked_bridge(monkeypatch, client, Slow(failing))
    assert client.closed == (4003, "link revoked")
    assert controller_close.done.is_set()


async def test_a_client_that_never_drains_does_not_hold_the_controller_open(monkeypatch: pytest.MonkeyPatch) -> None:
    client_close = Hanging()
    controller_closed = asyncio.Event()

    class Remembering(Controller):
        async def close(self) -> None:
            controller_closed.set()
            await super().close()

    class Stuck(Agent):
        async def close(self, code: int = 1000, reason: str = "") -> None:
            await client_close()

    await revoked_bridge(monkeypatch, Stuck([], expect=1), Remembering(failing))
    assert client_close.started.is_set() and not client_close.done.is_set()  # given up on, not waited out
    assert controller_closed.is_set()


async def test_a_controller_whose_close_hangs_is_aborted(monkeypatch: pytest.MonkeyPatch) -> None:
    class Stuck(Controller):
        transport = Transport()

        async def close(self) -> None:
            await Hanging()()

    client, controller = Agent([], expect=1), Stuck(failing)
    await revoked_bridge(monkeypatch, client, controller)
    assert client.closed == (4003, "link revoked")
    assert controller.transport.aborted


async def test_requests_count_as_in_flight_until_answered_or_the_relay_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    session = Session()
    seen: list[int] = []

    def answer(message: str | bytes) -> list[str]:
        seen.append(session.in_flight)  # while the controller holds it, the request is under way
        request_id = json.loads(message)["id"]
        return [] if request_id == 2 else [f'{{"ok":true,"id":{request_id},"result":{{}}}}']

    controller = Controller(answer)

    async def connect_ws(ws_url: str, secret: str) -> Controller:
        return controller

    monkeypatch.setattr(relay_module, "connect_ws", connect_ws)
    agent = Agent([json.dumps({"id": 1, "action": {}}), json.dumps({"id": 2, "action": {}})], expect=1)
    await relay(agent, session, Metrics())  # type: ignore[arg-type]
    assert seen == [1, 2]  # the first was still under way as the second went
    assert session.in_flight == 0  # answered, or no longer under way once the agent left


async def test_a_side_going_away_ends_a_relay_quietly_and_any_other_failure_is_raised_again() -> None:
    async def client_gone() -> None:
        raise WebSocketDisconnect(1001)

    async def sandbox_gone() -> None:
        raise ConnectionClosed(None, None)

    async def broken() -> None:
        raise ValueError("a bug in the relay")

    gone = {asyncio.create_task(client_gone()), asyncio.create_task(sandbox_gone())}
    failed = asyncio.create_task(broken())
    await asyncio.wait({*gone, failed})
    raise_unexpected(gone)
    with pytest.raises(ValueError, match="a bug in the relay"):
        raise_unexpected({*gone, failed})


async def test_cancel_all_leaves_none_of_a_relays_tasks_running() -> None:
    never = asyncio.Event()
    waiting = {asyncio.create_task(never.wait()), asyncio.create_task(never.wait())}
    await cancel_all(waiting)
    assert all(task.cancelled() for task in waiting)


def test_an_id_is_read_as_null_from_json_nested_past_the_parser_s_recursion() -> None:
    """Python's json raises RecursionError (no ValueError) about 1000 levels down: it killed the relay."""
    deep = '{"id": 3, "x": ' + "[" * 5000 + "]" * 5000 + "}"
    assert relay_module.request_key(deep) == relay_module.request_key(deep.encode()) == "null"
    assert relay_module.reply_key('{"ok":true,"result":' + "[" * 5000 + "]" * 5000 + ',"id":9}') == "null"
