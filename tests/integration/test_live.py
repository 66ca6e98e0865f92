"""The controller's live stream (WS /v1/live) against a real sandbox: frames, the lease, a human's input."""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from PIL import Image
from websockets.asyncio.client import ClientConnection

from corral.client import SandboxClient
from corral.contracts import auth
from corral.gateway.controller import connect_ws
from corral.runtime import SandboxAddress

from .conftest import await_title, center, find_color, open_page, screenshot_image

VIEWER = "human:lnk_it0live0test"
RED = (255, 0, 0)
GREEN = (0, 200, 0)
FORM = """
<button id=b style="position:absolute;left:200px;top:150px;width:160px;height:80px;background:#f00;border:0">go</button>
<input id=t style="position:absolute;left:200px;top:300px;width:300px;height:40px">
"""
FORM_JS = """
const b = document.getElementById('b'), t = document.getElementById('t');
b.addEventListener('click', () => { document.title = 'clicked'; b.style.background = 'rgb(0,200,0)'; t.focus(); });
t.addEventListener('input', () => { document.title = 'typed:' + t.value; });
"""


class Stream:
    """One live stream, its texts and frames read as they come."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self._seq = 0

    async def text(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """The next text message (frames in between are skipped)."""
        async with asyncio.timeout(timeout_s):
            while True:
                message = await self.ws.recv()
                if isinstance(message, str):
                    parsed: dict[str, Any] = json.loads(message)
                    return parsed

    async def frame(self, timeout_s: float = 10.0) -> Image.Image:
        """The next frame (texts in between are skipped)."""
        async with asyncio.timeout(timeout_s):
            while True:
                message = await self.ws.recv()
                if isinstance(message, bytes):
                    return Image.open(io.BytesIO(message)).convert("RGB")

    async def send(self, message: dict[str, Any]) -> dict[str, Any]:
        """Sends ``message`` with the next seq; its ack or error (lease pushes before it are skipped)."""
        self._seq += 1
        await self.ws.send(json.dumps({**message, "seq": self._seq}))
        while True:
            answer = await self.text()
            if answer.get("seq") == self._seq and answer["type"] in ("ack", "error"):
                return answer


@asynccontextmanager
async def live(sandbox: SandboxAddress, mode: str, viewer: str = VIEWER) -> AsyncIterator[Stream]:
    url = f"ws://{sandbox.host}:{sandbox.port}/v1/live?viewer={viewer}&mode={mode}"
    ws = await connect_ws(url, sandbox.secret)
    try:
        yield Stream(ws)
    finally:
        await ws.close()


@asynccontextmanager
async def holding(sandbox: SandboxAddress) -> AsyncIterator[Stream]:
    """A control stream (its hello read) whose viewer has taken the lease."""
    async with live(sandbox, "control") as stream:
        await stream.text()
        assert (await stream.send({"type": "take"}))["type"] == "ack"
        yield stream


def _has(image: Image.Image, rgb: tuple[int, int, int]) -> bool:
    try:
        find_color(image, rgb)
    except AssertionError:
        return False
    return True


async def _frame_with(stream: Stream, rgb: tuple[int, int, int], timeout_s: float = 10.0) -> Image.Image:
    deadline = time.monotonic() + timeout_s
    while True:
        image = await stream.frame(max(0.1, deadline - time.monotonic()))
        if _has(image, rgb):
            return image


def _recorded(sandbox: SandboxAddress) -> list[dict[str, Any]]:
    signed = auth.sign(sandbox.secret)
    # Long-polled a little: under load the last event (with its settled frame) may still be on its way.
    answer = httpx.get(f"{sandbox.base_url}/v1/recording?wait_ms=2000", headers=signed.headers, timeout=30)
    assert answer.status_code == 200, (answer.status_code, answer.headers, answer.text[:500])
    events: list[dict[str, Any]] = answer.json()["events"]
    return events


async def test_a_viewer_sees_a_frame_and_then_the_agents_change(sandbox: SandboxAddress, client: SandboxClient) -> None:
    await asyncio.to_thread(open_page, client, "<div style='width:100vw;height:100vh;background:#fff'></div>")
    async with live(sandbox, "view", "agent") as stream:
        hello = await stream.text()
        assert hello["type"] == "hello" and hello["mode"] == "view" and hello["viewer"] == "agent"
        shot = await asyncio.to_thread(screenshot_image, client)
        assert hello["screen"] == {"width": shot.width, "height": shot.height}
        assert hello["lease"]["holder"] == "agent"
        first = await stream.frame()
        assert first.size == (hello["screen"]["width"], hello["screen"]["height"])
        assert not _has(first, GREEN)
        await asyncio.to_thread(
            client.act,
            {"type": "navigate", "url": "data:text/html,<body style='margin:0;background:rgb(0,200,0)'>"},
        )
        assert _has(await _frame_with(stream, GREEN), GREEN)


async def test_view_mode_refuses_take_and_input(sandbox: SandboxAddress) -> None:
    async with live(sandbox, "view") as stream:
        await stream.text()
        take = await stream.send({"type": "take"})
        click = await stream.send({"type": "input", "action": {"type": "click", "x": 1, "y": 1}})
    assert take["error"]["code"] == "forbidden" and click["error"]["code"] == "forbidden"


async def test_a_human_takes_clicks_types_and_hands_back_while_the_agent_is_refused(
    sandbox: SandboxAddress, client: SandboxClient
) -> None:
    await asyncio.to_thread(open_page, client, FORM, FORM_JS)
    x, y = center(find_color(await asyncio.to_thread(screenshot_image, client), RED))
    async with live(sandbox, "control") as stream:
        assert (await stream.text())["lease"]["holder"] == "agent"
        early = await stream.send({"type": "input", "action": {"type": "click", "x": x, "y": y}})
        assert early["error"]["code"] == "control_taken" and early["error"]["holder"] == "agent"
        taken = await stream.send({"type": "take"})
        assert taken == {"type": "ack", "seq": 2}
        # The agent is refused while the human holds the lease.
        refused = await asyncio.to_thread(client.request, {"action": {"type": "page_info"}})
        assert refused["ok"] is False and refused["error"]["code"] == "control_taken"
        assert refused["error"]["holder"] == VIEWER
        assert await stream.send({"type": "input", "action": {"type": "click", "x": x, "y": y}}) == {
            "type": "ack",
            "seq": 3,
        }
        # As a person would: type once the page shows the click took (the button turns green).
        await _frame_with(stream, GREEN)
        typed = await stream.send({"type": "input", "action": {"type": "type", "text": "hi there"}})
        assert typed == {"type": "ack", "seq": 4}
        released = await stream.send({"type": "release", "note": "typed it for you"})
        assert released["type"] == "ack"
    reply = await asyncio.to_thread(client.act, {"type": "page_info"})
    assert reply["result"]["title"] == "typed:hi there" or (
        await asyncio.to_thread(await_title, client, "typed:hi there") == "typed:hi there"
    )
    # The hand-back reached the agent (in the reply above: the first after it).
    assert reply["control"]["by"] == VIEWER and reply["control"]["note"] == "typed it for you"
    events = [e for e in _recorded(sandbox) if e.get("actor") == VIEWER]
    kinds = [e["native"][0]["type"] for e in events]
    assert kinds == ["click", "type"]  # the click refused before the take never ran
    assert all(e["ok"] for e in events)
    assert all(e["dialect"] == "human" and e["action_id"].startswith("h") for e in events)


async def test_a_stream_that_closes_while_holding_gives_the_lease_back(
    sandbox: SandboxAddress, client: SandboxClient
) -> None:
    async with holding(sandbox), live(sandbox, "view", "agent") as watcher:
        assert (await watcher.text())["lease"]["holder"] == VIEWER
    # The stream's end reaches the controller a moment after the close: the agent waits for the lease.
    reply = await asyncio.to_thread(client.act, {"type": "cursor_position"}, wait_for_control_ms=5000)
    assert reply["ok"] is True and reply["control"]["left"] is True and reply["control"]["by"] == VIEWER


async def test_the_agent_gets_no_control_stream_and_an_oversized_message_closes_a_stream(
    sandbox: SandboxAddress, client: SandboxClient
) -> None:
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    # The agent only ever watches: a control stream for it is refused at the upgrade, the lease untouched.
    with pytest.raises(InvalidStatus) as refused:
        async with live(sandbox, "control", "agent"):
            pass
    assert refused.value.response.status_code == 403
    # uvicorn takes frames up to CDP's 64 MiB on every route: a viewer's over a MiB closes it (1009).
    async with live(sandbox, "control") as stream:
        await stream.text()
        await stream.ws.send("x" * (2 << 20))
        try:
            while True:
                await stream.text()
        except ConnectionClosed as closed:
            assert closed.rcvd is not None and closed.rcvd.code == 1009
    reply = await asyncio.to_thread(client.act, {"type": "cursor_position"})
    assert reply["ok"] is True and "control" not in reply


async def test_the_agents_clipboard_set_right_after_a_hand_back_is_kept(
    sandbox: SandboxAddress, client: SandboxClient
) -> None:
    # The selections are emptied between a person's hand-back and the agent's thaw
    # (corral.sandbox.agent.freezer): the agent's first requests after the hand-back wait for that, or
    # its own clipboard_set, landing while the emptying settles, was emptied with the person's copy.
    for round_ in range(3):
        async with holding(sandbox) as stream:
            assert (await stream.send({"type": "release"}))["type"] == "ack"
        text = f"the agent's own {round_}"
        await asyncio.to_thread(client.act, {"type": "clipboard_set", "text": text})
        assert (await asyncio.to_thread(client.act, {"type": "clipboard_get"}))["result"]["text"] == text
        # Still there once the emptying's settle time (0.5 s) has surely passed.
        await asyncio.sleep(1.0)
        assert (await asyncio.to_thread(client.act, {"type": "clipboard_get"}))["result"]["text"] == text
