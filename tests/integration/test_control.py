"""The agent's side of the control lease against a real sandbox: ``control`` and ``request_control``
with nobody there, and with a human holding the lease through the controller's live stream
(WS /v1/live): refusals over WebSocket and HTTP (409), a request that waits for the hand-back, a help
request a human answers, and each change as a recording ``control`` event."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.client import SandboxClient
from corral.contracts import auth
from corral.recording.bundle import read_bundle
from corral.runtime import SandboxAddress
from corral.sdk import Sandbox

from .dockerutil import DockerHarness
from .gateway_fixtures import KEY_A, RunningGateway, module_gateway, replay_cli, unpack_recording
from .test_live import VIEWER, _recorded, holding, live
from .test_mcp import connect, ok


def _control_events(sandbox: SandboxAddress, since_seq: int) -> list[dict[str, Any]]:
    return [e for e in _recorded(sandbox) if e.get("event") == "control" and e["seq"] > since_seq]


def _control_events_when(sandbox: SandboxAddress, since_seq: int, count: int) -> list[dict[str, Any]]:
    """The control events after ``since_seq``, once there are ``count`` (events publish in the background)."""
    deadline = time.monotonic() + 10
    while len(events := _control_events(sandbox, since_seq)) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    return events


def _last_seq(sandbox: SandboxAddress) -> int:
    return max((e["seq"] for e in _recorded(sandbox)), default=0)


def _post(sandbox: SandboxAddress, message: dict[str, Any]) -> httpx.Response:
    headers = {**auth.sign(sandbox.secret).headers, "content-type": "application/json"}
    return httpx.post(f"{sandbox.base_url}/v1/actions", content=json.dumps(message), headers=headers, timeout=30)


def test_control_and_an_unanswered_help_request_with_nobody_there(
    sandbox: SandboxAddress, client: SandboxClient
) -> None:
    before = _last_seq(sandbox)
    held = client.act({"type": "control", "wait_ms": 5000})
    assert held["result"]["holder"] == "agent" and held["result"]["help"] is None
    assert held["result"]["handed_back"] is None and "control" not in held
    assert held["elapsed_ms"] < 1000  # the agent holds it: no wait
    began = time.monotonic()
    asked = client.act({"type": "request_control", "reason": "solve the CAPTCHA", "wait_ms": 300})
    assert time.monotonic() - began >= 0.3
    assert asked["result"]["holder"] == "agent" and asked["result"]["handed_back"] is None
    assert asked["result"]["help"] is None  # ended when the wait ran out
    events = _control_events_when(sandbox, before, 2)
    assert [(e["change"], e.get("reason")) for e in events] == [
        ("requested", "solve the CAPTCHA"),
        ("request_ended", None),
    ]
    assert all("frame_webp" not in e and e["holder"] == "agent" for e in events)


async def test_while_a_human_holds_the_lease_requests_are_refused_or_wait_for_the_hand_back(
    sandbox: SandboxAddress, client: SandboxClient
) -> None:
    async with holding(sandbox) as stream:
        # Over HTTP: 409, the holder named; a command is refused as an action is.
        refused = await asyncio.to_thread(_post, sandbox, {"id": 1, "action": {"type": "exec", "command": "true"}})
        assert refused.status_code == 409
        assert refused.json()["error"] == {
            "code": "control_taken",
            "message": f"control of the session is held by {VIEWER}; wait for it to be handed back",
            "holder": VIEWER,
            "since": refused.json()["error"]["since"],
        }
        # control answers the holder without being refused.
        held = await asyncio.to_thread(client.act, {"type": "control"})
        assert held["result"]["holder"] == VIEWER and held["result"]["handed_back"] is None
        # A request that may wait is still waiting while the human holds the lease...
        message = {"action": {"type": "cursor_position"}, "wait_for_control_ms": 30_000}
        waiting = asyncio.ensure_future(asyncio.to_thread(client.request, message))
        await asyncio.sleep(1.0)
        assert not waiting.done()
        released = await stream.send({"type": "release", "note": "logged in for you"})
        assert released["type"] == "ack"
        # ... and runs once it is handed back, carrying the note once.
        reply = await asyncio.wait_for(waiting, 10)
    assert reply["ok"] is True and reply["elapsed_ms"] >= 900
    assert reply["control"]["by"] == VIEWER and reply["control"]["note"] == "logged in for you"
    assert reply["control"]["left"] is False
    again = await asyncio.to_thread(client.act, {"type": "cursor_position"})
    assert "control" not in again


async def test_a_help_request_is_answered_by_a_human_and_recorded(
    sandbox: SandboxAddress, client: SandboxClient
) -> None:
    before = await asyncio.to_thread(_last_seq, sandbox)
    async with live(sandbox, "control") as stream:
        await stream.text()
        message = {"action": {"type": "request_control", "reason": "approve the payment", "wait_ms": 60_000}}
        asking = asyncio.ensure_future(asyncio.to_thread(client.request, message))
        pushed = await stream.text()
        while pushed.get("type") != "lease" or pushed["lease"]["help"] is None:
            pushed = await stream.text()
        assert pushed["lease"]["help"]["reason"] == "approve the payment"
        assert (await stream.send({"type": "take"}))["type"] == "ack"
        assert (await stream.send({"type": "release", "note": "approved"}))["type"] == "ack"
        answer = await asyncio.wait_for(asking, 10)
    assert answer["ok"] is True and "control" not in answer  # in the result instead
    result = answer["result"]
    assert result["holder"] == "agent" and result["help"] is None
    assert result["handed_back"]["by"] == VIEWER and result["handed_back"]["note"] == "approved"
    events = await asyncio.to_thread(_control_events_when, sandbox, before, 4)
    assert [(e["change"], e["holder"], e["previous"]) for e in events] == [
        ("requested", "agent", "agent"),
        ("taken", VIEWER, "agent"),
        ("returned", "agent", VIEWER),
        ("request_ended", "agent", VIEWER),
    ]
    assert events[0]["reason"] == "approve the payment" and events[2]["note"] == "approved"


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness, desktop_image: str, egress_image: str
) -> Iterator[RunningGateway]:
    with module_gateway(tmp_path_factory, runtime, "it-ctl") as running:
        yield running


def test_the_sdk_through_the_gateway_and_a_bundle_with_control_events_replays(
    gw: RunningGateway, tmp_path: Path
) -> None:
    with Sandbox.create(url=gw.url, api_key=KEY_A) as sb:
        sb.wait_for_control_ms = 2000  # sent with each request; nobody holds the lease, so no wait
        held = sb.control()
        assert held.holder == "agent" and held.since > 0 and held.help is None and held.handed_back is None
        asked = sb.request_control("solve the CAPTCHA", wait_ms=200)
        assert asked.handed_back is None and asked.help is None
        sb.act({"type": "cursor_position"})
        assert sb.handed_back is None
        session_id = sb.id

    def complete(bundle: Any) -> bool:
        return len([e for e in bundle.events if e["event"] == "control"]) >= 2 and len(bundle.actions) >= 3

    (tmp_path / "bundle").mkdir()
    directory = unpack_recording(gw, session_id, tmp_path / "bundle", complete)
    bundle = read_bundle(directory)
    controls = [e for e in bundle.events if e["event"] == "control"]
    assert [(e["change"], e.get("reason")) for e in controls] == [
        ("requested", "solve the CAPTCHA"),
        ("request_ended", None),
    ]
    assert all("frame" not in e and "audit" not in e and e["controller_seq"] for e in controls)
    assert [e["native"][0]["type"] for e in bundle.actions] == ["control", "request_control", "cursor_position"]
    code, junit, report = replay_cli(gw, directory, tmp_path)
    assert code == 0, report
    assert 'tests="3"' in junit and 'skipped="2"' in junit and 'failures="0"' in junit


async def test_the_mcp_tools_ask_the_lease_and_a_help_request_nobody_answers(gw: RunningGateway) -> None:
    async with connect(gw, "http-2026") as client:
        session_id = (await ok(client, "create_session"))["id"]
        try:
            held = await ok(client, "control", session_id=session_id)
            assert held["holder"] == "agent" and held["handed_back"] is None and held["help"] is None
            asked = await ok(client, "request_control", session_id=session_id, reason="log in", wait_ms=200)
            assert asked["holder"] == "agent" and asked["handed_back"] is None and asked["help"] is None
        finally:
            await ok(client, "end_session", session_id=session_id)


async def test_a_request_whose_client_left_while_it_waited_for_the_lease_never_runs(
    sandbox: SandboxAddress, client: SandboxClient
) -> None:
    def gives_up(message: dict[str, Any]) -> None:
        headers = {**auth.sign(sandbox.secret).headers, "content-type": "application/json"}
        with pytest.raises(httpx.ReadTimeout):  # the client hangs up after a second
            httpx.post(f"{sandbox.base_url}/v1/actions", content=json.dumps(message), headers=headers, timeout=1)

    await asyncio.to_thread(client.act, {"type": "move", "x": 10, "y": 10})
    async with holding(sandbox) as stream:
        for kind in ("move", "exec"):  # one desktop request, one run apart
            action: dict[str, Any] = {"type": "move", "x": 123, "y": 45}
            if kind == "exec":
                action = {"type": "exec", "command": "xdotool mousemove 321 54"}
            await asyncio.to_thread(gives_up, {"action": action, "wait_for_control_ms": 30_000})
        assert (await stream.send({"type": "release", "note": "back to you"}))["type"] == "ack"
    await asyncio.sleep(1.0)  # a stale request, had one stayed, would have run by now
    reply = await asyncio.to_thread(client.act, {"type": "cursor_position"})
    assert (reply["result"]["x"], reply["result"]["y"]) == (10, 10)
    # The hand-back was left for a reply someone reads.
    assert reply["control"]["note"] == "back to you"
