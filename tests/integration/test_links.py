"""Viewer links and the gateway's live stream against a real gateway, sandbox and egress proxy: the
links API, what a link opens, the live stream's auth, a revoke closing its stream within a second,
an expiry, a foreign link, and the link's records in the verified audit chain."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from corral.proxy.audit import verify

from .dockerutil import DockerHarness
from .egress_fixtures import Upstream, gateway_to, start_upstream
from .gateway_fixtures import KEY_A, KEY_B, RunningGateway

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[Upstream]:
    network = f"corral-links-it-{os.getpid()}"
    yield from start_upstream(runtime, tmp_path_factory.mktemp("upstream"), network, name="corral-links-upstream")


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory, upstream: Upstream, runtime: DockerHarness
) -> Iterator[RunningGateway]:
    instance = f"links-{os.getpid()}"
    with gateway_to(upstream, tmp_path_factory.mktemp("links-gw"), instance) as running:
        yield running
    runtime.remove_all({"corral.gateway": instance})


@pytest.fixture()
def session(gw: RunningGateway) -> Iterator[dict[str, Any]]:
    with gw.client() as c:
        made = c.post("/v1/sessions", json={"allow": ["allowed.test"]})
        assert made.status_code == 201, made.text
        yield made.json()
        c.delete(f"/v1/sessions/{made.json()['id']}")


def make_link(gw: RunningGateway, session_id: str, mode: str = "view", **body: Any) -> tuple[dict[str, Any], str]:
    with gw.client() as c:
        made = c.post(f"/v1/sessions/{session_id}/links", json={"mode": mode, **body})
    assert made.status_code == 201, made.text
    return made.json(), made.json()["url"].split("#link=", 1)[1]


def audit(gw: RunningGateway, session_id: str, tmp_path: Path) -> list[dict[str, Any]]:
    """The session's whole audit log, its chain verified."""
    with gw.client() as c:
        log = c.get(f"/v1/sessions/{session_id}/traffic")
    assert log.status_code == 200, log.text
    path = tmp_path / "audit.jsonl"
    path.write_bytes(log.content)
    assert verify(path).ok
    return [json.loads(line) for line in log.text.splitlines() if line]


def link_changes(records: list[dict[str, Any]], link_id: str) -> list[str]:
    return [r["change"] for r in records if r["event"] == "link" and r["link"] == link_id]


async def open_live(gw: RunningGateway, session_id: str, credential: str) -> ClientConnection:
    ws = await connect(f"{gw.ws}/v1/sessions/{session_id}/live", max_size=None)
    await ws.send(json.dumps({"type": "auth", "credential": credential}))
    return ws


async def first_text(ws: ClientConnection) -> dict[str, Any]:
    async with asyncio.timeout(20):
        while True:
            message = await ws.recv()
            if isinstance(message, str):
                parsed: dict[str, Any] = json.loads(message)
                return parsed


async def command(ws: ClientConnection, message: dict[str, Any]) -> dict[str, Any]:
    """Sends a viewer message; the answer to its seq (lease pushes before it skipped)."""
    await ws.send(json.dumps(message))
    async with asyncio.timeout(20):
        while True:
            answer = await ws.recv()
            if isinstance(answer, str):
                parsed: dict[str, Any] = json.loads(answer)
                if parsed.get("seq") == message["seq"] and parsed["type"] in ("ack", "error"):
                    return parsed


async def wait_until(predicate: Any, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(predicate):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.2)
    return True


async def closed(ws: ClientConnection, timeout_s: float) -> tuple[int, str, float]:
    """The close code and reason, and when it came (``time.monotonic``); frames before it are skipped."""
    async with asyncio.timeout(timeout_s):
        try:
            while True:
                await ws.recv()
        except ConnectionClosed as exc:
            assert exc.rcvd is not None
            return exc.rcvd.code, exc.rcvd.reason, time.monotonic()


def test_the_owner_makes_lists_and_revokes_and_each_is_in_the_audit_chain(
    gw: RunningGateway, session: dict[str, Any], tmp_path: Path
) -> None:
    sid = session["id"]
    link, secret = make_link(gw, sid, "control", ttl_s=600)
    assert link["url"] == f"{gw.url}/v1/sessions/{sid}/viewer#link={secret}"
    with gw.client(session["token"]) as agent:
        refused = agent.post(f"/v1/sessions/{sid}/links", json={"mode": "control"})
        assert (refused.status_code, refused.json()["error"]["code"]) == (403, "forbidden")
    with gw.client(session["token"]) as agent:
        fetched = agent.post(
            f"/v1/sessions/{sid}/actions",
            json={"action": {"type": "exec", "argv": ["curl", "-s", "-o", "/dev/null", "https://allowed.test/x"]}},
        )
        assert fetched.status_code == 200, fetched.text
    action = fetched.json()["action_id"]
    with gw.client(secret) as viewer:
        assert viewer.get(f"/v1/sessions/{sid}/recording/events").status_code == 200
        # One action's traffic, as the viewer page reads it: never the policy, the secrets' or links' records.
        for params in (
            {},
            {"event": "link"},
            {"event": "policy", "action": action},
            {"event": "link", "action": action},
        ):
            assert viewer.get(f"/v1/sessions/{sid}/traffic", params=params).status_code == 403, params
        read = viewer.get(f"/v1/sessions/{sid}/traffic", params={"action": action})
        assert read.status_code == 200, read.text
        events = {json.loads(line)["event"] for line in read.text.splitlines()}
        assert "request" in events and events <= {"connect", "request", "block", "error", "secret"}
        for method, path in [("POST", "/actions"), ("GET", "/files?path=/etc/hostname"), ("GET", "/traffic.har")]:
            assert viewer.request(method, f"/v1/sessions/{sid}{path}", json={}).status_code == 403, path
    with gw.client() as owner:
        listed = owner.get(f"/v1/sessions/{sid}/links").json()
        assert [(x["id"], x["mode"], x["revoked_at"]) for x in listed] == [(link["id"], "control", None)]
        assert listed[0]["last_used_at"] is not None  # its HTTP reads are its use
        assert owner.delete(f"/v1/sessions/{sid}/links/{link['id']}").status_code == 200
    with gw.client(secret) as viewer:
        gone = viewer.get(f"/v1/sessions/{sid}/recording/events")
        assert (gone.status_code, gone.json()["error"]["message"]) == (401, "link revoked")
    records = audit(gw, sid, tmp_path)
    assert link_changes(records, link["id"]) == ["created", "used", "revoked"]  # used: its first read
    made = next(r for r in records if r["event"] == "link")
    assert (made["mode"], made["expires_at"]) == ("control", link["expires_at"])
    assert made["actor"] == "api-key:owner"  # the owner, never its key's id
    assert secret not in json.dumps(records)


async def test_a_revoke_closes_the_live_stream_within_a_second(
    gw: RunningGateway, session: dict[str, Any], tmp_path: Path
) -> None:
    sid = session["id"]
    link, secret = make_link(gw, sid, "control")
    ws = await open_live(gw, sid, secret)
    hello = await first_text(ws)
    assert (hello["type"], hello["viewer"], hello["mode"]) == ("hello", f"human:{link['id']}", "control")
    async with asyncio.timeout(20):
        while not isinstance(await ws.recv(), bytes):  # the screen, relayed as a binary frame
            pass
    assert await command(ws, {"type": "take", "seq": 1}) == {"type": "ack", "seq": 1}
    with gw.client() as owner:
        assert owner.get(f"/v1/sessions/{sid}/links").json()[0]["streams"] == 1
        revoked_at = time.monotonic()
        await asyncio.to_thread(owner.delete, f"/v1/sessions/{sid}/links/{link['id']}")
    code, reason, when = await closed(ws, 5)
    assert (code, reason) == (4003, "link revoked")
    assert when - revoked_at < 1.0
    again = await open_live(gw, sid, secret)
    assert (await closed(again, 10))[:2] == (4401, "link revoked")
    human = f"human:{link['id']}"

    def lease_changes() -> list[tuple[str, str, str]]:
        records = audit(gw, sid, tmp_path)
        return [(r["change"], r["holder"], r["previous"]) for r in records if r["event"] == "control"]

    # The controller's lease changes are in the chain too: taken, and left when the stream closed.
    assert await wait_until(lambda: len(lease_changes()) >= 2)
    assert lease_changes() == [("taken", human, "agent"), ("left", "agent", human)]
    assert link_changes(audit(gw, sid, tmp_path), link["id"]) == ["created", "used", "revoked"]


async def test_a_link_s_stream_closes_at_its_expiry_and_the_link_then_opens_nothing(
    gw: RunningGateway, session: dict[str, Any], tmp_path: Path
) -> None:
    sid = session["id"]
    link, secret = make_link(gw, sid, "view", ttl_s=3)
    ws = await open_live(gw, sid, secret)
    assert (await first_text(ws))["mode"] == "view"
    code, reason, _ = await closed(ws, 15)
    assert (code, reason) == (4003, "link expired")
    assert -0.01 < time.time() - link["expires_at"] < 1.0  # at its expiry, not before
    with gw.client(secret) as viewer:
        gone = viewer.get(f"/v1/sessions/{sid}/recording/events")
        assert (gone.status_code, gone.json()["error"]["message"]) == (401, "link expired")
    assert link_changes(audit(gw, sid, tmp_path), link["id"]) == ["created", "used", "expired"]


async def test_the_live_stream_s_credentials(gw: RunningGateway, session: dict[str, Any]) -> None:
    sid = session["id"]
    with gw.client() as owner:
        other = owner.post("/v1/sessions", json={}).json()
    try:
        _, foreign = make_link(gw, other["id"], "control")
        assert (await closed(await open_live(gw, sid, foreign), 10))[:2] == (
            4403,
            "this viewer link is for another session",
        )
        with gw.client(foreign) as viewer:
            assert viewer.get(f"/v1/sessions/{sid}/recording/events").status_code == 403
        assert (await closed(await open_live(gw, sid, KEY_B), 10))[0] == 4403
        assert (await closed(await open_live(gw, sid, "crl_link_nothing"), 10))[0] == 4401
        owner_ws = await open_live(gw, sid, KEY_A)
        assert (await first_text(owner_ws))["mode"] == "control"
        await owner_ws.close()
        agent_ws = await open_live(gw, sid, session["token"])
        hello = await first_text(agent_ws)
        assert (hello["viewer"], hello["mode"]) == ("agent", "view")
        with gw.client() as owner:
            owner.delete(f"/v1/sessions/{sid}")
        assert (await closed(agent_ws, 10))[:2] == (4000, "session ended: deleted")
    finally:
        with gw.client() as owner:
            owner.delete(f"/v1/sessions/{other['id']}")


# A text field over the whole page; each letter typed loads an image from the fake upstream.
TYPING_PAGE = "<textarea id=t autofocus style='position:fixed;left:0;top:0;width:100%;height:100%'></textarea>"
TYPING_SCRIPT = """
const t = document.getElementById('t');
t.focus();
t.addEventListener('input', () => { new Image().src = 'https://allowed.test/typed/' + t.value.length; });
"""


async def test_a_human_s_traffic_names_the_link_and_the_agent_s_does_not(
    gw: RunningGateway, session: dict[str, Any], tmp_path: Path
) -> None:
    from .conftest import html_url

    sid = session["id"]
    with gw.client(session["token"]) as agent:
        opened = agent.post(
            f"/v1/sessions/{sid}/actions",
            json={"id": 1, "action": {"type": "navigate", "url": html_url(TYPING_PAGE, TYPING_SCRIPT)}},
        )
        assert opened.status_code == 200, opened.text
        fetched = agent.post(
            f"/v1/sessions/{sid}/actions",
            json={
                "id": 2,
                "action": {"type": "exec", "argv": ["curl", "-s", "-o", "/dev/null", "https://allowed.test/agent"]},
            },
        )
        assert fetched.status_code == 200, fetched.text
    link, secret = make_link(gw, sid, "control")
    human = f"human:{link['id']}"
    ws = await open_live(gw, sid, secret)
    assert (await first_text(ws))["mode"] == "control"
    assert await command(ws, {"type": "take", "seq": 1}) == {"type": "ack", "seq": 1}
    # A click in the middle of the screen is on the page's field (the address bar may hold the focus).
    hello_screen = session["viewport"]
    click = {"type": "click", "x": hello_screen["width"] // 2, "y": hello_screen["height"] // 2}
    assert await command(ws, {"type": "input", "seq": 2, "action": click}) == {"type": "ack", "seq": 2}
    typed = await command(
        ws, {"type": "input", "seq": 3, "action": {"type": "type", "text": "corral " * 4, "delay_ms": 100}}
    )
    assert typed == {"type": "ack", "seq": 3}  # 2.8 s of typing: the page's requests come while it runs

    def upstream_records() -> list[dict[str, Any]]:
        return [r for r in audit(gw, sid, tmp_path) if r["event"] == "request" and r.get("host") == "allowed.test"]

    assert await wait_until(lambda: any(r.get("actor") == human for r in upstream_records())), [
        {k: r.get(k) for k in ("event", "host", "url", "action", "actor")} for r in audit(gw, sid, tmp_path)
    ]
    await ws.close()
    records = upstream_records()
    by_human = [r for r in records if r.get("actor") == human]
    assert by_human and all(r["url"].startswith("https://allowed.test/typed/") for r in by_human)
    assert all(r["action"].startswith("h") for r in by_human)  # the human's input action, h<n>.<boot>
    agents = [r for r in records if r["url"] == "https://allowed.test/agent"]
    assert agents and all("actor" not in r for r in agents)  # the agent's records are as before


NOISE_PAGE = "https://allowed.test/page/noise.html"


async def test_a_revoke_hands_the_lease_back_at_once_from_a_viewer_that_stopped_reading(
    gw: RunningGateway, session: dict[str, Any]
) -> None:
    sid = session["id"]
    with gw.client(session["token"]) as agent:
        # A screen that changes all the time in large frames: they back up behind a viewer that reads none.
        noisy = agent.post(f"/v1/sessions/{sid}/actions", json={"action": {"type": "navigate", "url": NOISE_PAGE}})
        assert noisy.status_code == 200, noisy.text
    link, secret = make_link(gw, sid, "control")
    ws = await connect(f"{gw.ws}/v1/sessions/{sid}/live", max_size=None, max_queue=1)
    await ws.send(json.dumps({"type": "auth", "credential": secret}))
    assert (await first_text(ws))["mode"] == "control"
    assert await command(ws, {"type": "take", "seq": 1}) == {"type": "ack", "seq": 1}
    await asyncio.sleep(4)  # never read again: the gateway's writes to it stall
    with gw.client(session["token"]) as agent:
        held = agent.post(f"/v1/sessions/{sid}/actions", json={"action": {"type": "wait", "ms": 0}})
        assert (held.status_code, held.json()["error"]["code"]) == (409, "control_taken")
        with gw.client() as owner:
            revoked_at = time.monotonic()
            assert (await asyncio.to_thread(owner.delete, f"/v1/sessions/{sid}/links/{link['id']}")).status_code == 200

        def acts() -> bool:
            return agent.post(f"/v1/sessions/{sid}/actions", json={"action": {"type": "wait", "ms": 0}}).is_success

        assert await wait_until(acts, timeout_s=10)
        assert time.monotonic() - revoked_at < 1.5  # not the ~40 s of the stalled close
    ws.transport.abort()


async def test_a_person_driving_and_an_agent_waiting_for_one_are_not_idleness(gw: RunningGateway) -> None:
    with gw.client() as owner:
        made = owner.post("/v1/sessions", json={"allow": ["allowed.test"], "idle_timeout_s": 2})
        assert made.status_code == 201, made.text
    sid, token = made.json()["id"], made.json()["token"]
    try:
        _, secret = make_link(gw, sid, "control")
        ws = await open_live(gw, sid, secret)
        assert (await first_text(ws))["mode"] == "control"
        assert await command(ws, {"type": "take", "seq": 1}) == {"type": "ack", "seq": 1}
        await asyncio.sleep(5)  # a person looking, between inputs, for more than the idle timeout
        assert await command(ws, {"type": "release", "seq": 2, "note": "done"}) == {"type": "ack", "seq": 2}
        await ws.close()
        async with connect(
            f"{gw.ws}/v1/sessions/{sid}/ws", additional_headers={"Authorization": f"Bearer {token}"}
        ) as agent:
            await agent.send(json.dumps({"id": 1, "action": {"type": "control"}}))  # the person's note, taken
            asked = {"type": "request_control", "reason": "solve the puzzle", "wait_ms": 5000}
            await agent.send(json.dumps({"id": 2, "action": asked}))
            async with asyncio.timeout(20):
                handed_back = json.loads(await agent.recv())
                answer = json.loads(await agent.recv())
        assert handed_back["result"]["handed_back"]["note"] == "done"
        # Nobody came within the wait, longer than the idle timeout: answered, the session alive.
        assert answer["ok"] and answer["result"]["handed_back"] is None, answer
        assert answer["elapsed_ms"] >= 5000
        with gw.client() as owner:
            assert owner.get(f"/v1/sessions/{sid}").status_code == 200
    finally:
        with gw.client() as owner:
            owner.delete(f"/v1/sessions/{sid}")
