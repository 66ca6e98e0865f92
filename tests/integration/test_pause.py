"""Pause and resume against the real images and a real gateway with egress: a session paused (its
tabs, /workspace and ~/.local saved, its sandbox removed, its proxy stopped, its slot freed) and
resumed (the same id and token, the file, the tabs with the active one in front, the audit chain
carried on, the recording marked); the browser's cookies and local storage kept (held in memory, no
profile key); a session on a workspace volume keeping it held (detached) while paused and remounted
at its resume; an idle pause; a paused session's expiry; actions, WebSockets
and files on a paused session refused with 409 session_paused; bad input; a gateway restart
while paused, whose lost secret values a resume asks for by name; and the async SDK's twins."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from corral.gateway_client import Gateway
from corral.recording.bundle import Bundle, read_bundle
from corral.sdk import AsyncSandbox, Sandbox

from .dockerutil import DockerHarness
from .egress_fixtures import Upstream, gateway_to, session_fixtures
from .gateway_fixtures import KEY_A, RunningGateway, unpack_recording

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")

BANK = "https://allowed.test/page/bank.html"
PHISH = "https://allowed.test/page/phish.html"
PROFILE_PAGE = "https://allowed.test/page/profile.html"  # its title says the cookie and localStorage item

upstream, gw, sb = session_fixtures("pause", upstream_name="corral-pause-upstream")


@pytest.fixture(scope="module")
def small_gw(
    tmp_path_factory: pytest.TempPathFactory, upstream: Upstream, runtime: DockerHarness
) -> Iterator[RunningGateway]:
    """One slot and one paused session."""
    instance = f"pause-small-{os.getpid()}"
    with gateway_to(
        upstream,
        tmp_path_factory.mktemp("pause-small"),
        instance,
        max_sessions=1,
        max_sessions_per_key=1,
        max_paused=1,
    ) as running:
        yield running
    runtime.remove_all({"corral.gateway": instance})


def _state(gw: RunningGateway, session_id: str) -> str:
    with gw.client() as c:
        return str(c.get(f"/v1/sessions/{session_id}").json()["state"])


def _wait_state(gw: RunningGateway, session_id: str, state: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while (now := _state(gw, session_id)) != state:
        assert time.monotonic() < deadline, f"still {now}"
        time.sleep(0.25)


def _code(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, str(response.json()["error"]["code"])


def test_pause_and_resume_keep_the_token_files_and_tabs(
    gw: RunningGateway, sb: Sandbox, runtime: DockerHarness
) -> None:
    token = sb._token
    sb.exec(
        "mkdir -p ~/.local/bin && printf 'echo tool' > ~/.local/bin/tool && echo kept > /workspace/notes.txt"
        " && ln -s /usr/bin/python3 ~/.local/bin/py3"  # a link out, as a venv's bin/python: kept as a link
    )
    sb.navigate(BANK)
    second = sb.tab_new(PHISH)
    first = next(t for t in sb.tabs() if t.url == BANK)
    sb.tab_switch(first.id)
    old_container = sb.info.container
    with connect(f"{sb.info.ws_url}?token={token}") as ws:  # a second client, open as the session pauses
        paused = sb.pause()
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)

    assert paused.state == "paused" and paused.paused_at is not None
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4009
    assert "paused" in closed.value.rcvd.reason
    assert runtime.find(old_container) is None
    proxies = runtime.proxy_states({"corral.session": sb.id})
    assert proxies.get(sb.id) == "exited"  # stopped, kept: its state and chain carry on
    with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as agent:
        action = agent.post(f"/v1/sessions/{sb.id}/actions", json={"action": {"type": "tabs"}})
        files = agent.get(f"/v1/sessions/{sb.id}/files", params={"path": "/workspace/notes.txt"})
        shown = agent.get(f"/v1/sessions/{sb.id}")
    assert _code(action) == (409, "session_paused")
    assert _code(files) == (409, "session_paused")
    assert shown.json()["state"] == "paused"
    with connect(f"{sb.info.ws_url}?token={token}") as refused, pytest.raises(ConnectionClosed) as why:
        refused.recv(timeout=30)
    assert why.value.rcvd is not None and why.value.rcvd.code == 4409  # 4000 + the HTTP status, as every refusal
    assert "is paused: resume it first" in why.value.rcvd.reason
    with gw.client() as c:
        assert _code(c.post(f"/v1/sessions/{sb.id}/pause")) == (409, "session_not_paused")
        listed = {s["id"]: s for s in c.get("/v1/sessions").json()}
    assert listed[sb.id]["state"] == "paused" and listed[sb.id]["paused_at"] == paused.paused_at

    resumed = sb.resume()  # the same token opens the new sandbox's WebSocket

    assert resumed.state == "ready" and resumed.id == paused.id and resumed.container != old_container
    assert sb.exec("cat /workspace/notes.txt").stdout == "kept\n"
    assert sb.exec("cat ~/.local/bin/tool; stat -c %U /workspace/notes.txt").stdout == "echo toolagent\n"
    assert sb.exec("readlink ~/.local/bin/py3").stdout == "/usr/bin/python3\n"
    tabs = sb.tabs()
    assert [t.url for t in tabs] == [BANK, second.url]
    assert [t.url for t in tabs if t.active] == [BANK]
    assert sb.page_info().title == "Real Bank"
    with gw.client() as c:
        assert _code(c.post(f"/v1/sessions/{sb.id}/resume", json={})) == (409, "session_not_paused")
        assert c.post("/v1/sessions/ses_0000000000000000/pause").status_code == 404
        audit = c.get(f"/v1/sessions/{sb.id}/traffic").text
    assert audit.count("allowed.test") >= 2  # before the pause and after it, one log
    records = [json.loads(line) for line in audit.splitlines() if line]
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1))  # one chain, carried on
    changes = [r for r in records if r["event"] == "session"]
    assert [r["change"] for r in changes] == ["pause", "resume"]
    assert set(changes[0]["saved"]) == {"/workspace", "/home/agent"} and changes[0]["tabs"] == 2


def test_the_browsers_cookie_and_local_storage_come_back(gw: RunningGateway, sb: Sandbox) -> None:
    """No CORRAL_PROFILE_KEY here: the browser's state is held in the gateway's memory, nothing on disk."""
    assert sb.navigate(PROFILE_PAGE + "?set=kept").title == "cookie=kept;ls=kept"
    sb.navigate(BANK)  # the tab reopened at the resume must not set them again
    assert sb.pause().state == "paused"
    saved = gw.settings.data_dir / "paused" / sb.id
    assert sorted(p.name for p in saved.iterdir()) == ["home-agent.tar", "workspace.tar"]  # no browser blob

    sb.resume()

    assert sb.navigate(PROFILE_PAGE).title == "cookie=kept;ls=kept"  # a new sandbox, a new Chromium
    assert not saved.exists()
    with gw.client() as c:
        audit = [json.loads(line) for line in c.get(f"/v1/sessions/{sb.id}/traffic").text.splitlines() if line]
    assert [r["change"] for r in audit if r["event"] == "session"] == ["pause", "resume"]


def _loops_of(images: Path) -> list[str]:
    listing = subprocess.run(["losetup", "--list", "--json"], capture_output=True, text=True, check=True).stdout
    devices = json.loads(listing or '{"loopdevices": []}')["loopdevices"]
    return [d["name"] for d in devices if str(d.get("back-file", "")).startswith(str(images))]


def test_a_volume_stays_held_while_paused_and_is_remounted(gw: RunningGateway) -> None:
    volumes = gw.settings.data_dir / "volumes"
    with Gateway(gw.url, KEY_A) as owner:
        owner.create_volume("paused-work", 16)
        try:
            with Sandbox.create(url=gw.url, api_key=KEY_A, volume="paused-work", allow=["allowed.test"]) as box:
                box.exec("echo before > /workspace/kept.txt && sync")
                assert len(_loops_of(volumes)) == 1
                box.pause()

                assert owner.volume("paused-work").in_use_by == box.id
                with gw.client(KEY_A) as http:
                    taken = http.post("/v1/sessions", json={"volume": "paused-work"})
                    busy = http.delete("/v1/volumes/paused-work")
                assert _code(taken) == (409, "volume_in_use") and box.id in taken.json()["error"]["message"]
                assert _code(busy) == (409, "volume_in_use")
                assert _loops_of(volumes) == []  # detached while its sandbox is gone
                assert not (gw.settings.data_dir / "paused" / box.id / "workspace.tar").exists()  # on the volume

                box.resume()

                assert box.exec("cat /workspace/kept.txt").stdout == "before\n"
                assert "nosuid" in box.exec("grep ' /workspace ' /proc/self/mountinfo").stdout  # the volume's mount
                box.exec("echo after >> /workspace/kept.txt")
                assert owner.volume("paused-work").in_use_by == box.id and len(_loops_of(volumes)) == 1
            assert owner.volume("paused-work").in_use_by is None  # its end released it
            assert _loops_of(volumes) == []
            with Sandbox.create(url=gw.url, api_key=KEY_A, volume="paused-work") as later:
                assert later.exec("cat /workspace/kept.txt").stdout == "before\nafter\n"
                later.pause()  # and ended while paused (the block's delete)
            assert owner.volume("paused-work").in_use_by is None  # a paused session's end releases it too
            assert _loops_of(volumes) == []
        finally:
            owner.delete_volume("paused-work")


def test_the_recording_carries_on_with_markers(gw: RunningGateway, sb: Sandbox, tmp_path: Path) -> None:
    sb.navigate(BANK)
    sb.pause()
    sb.resume()
    sb.page_info()

    def marked(bundle: Bundle) -> bool:
        events = [e.get("event") for e in bundle.events]
        return "resume" in events and events.index("resume") < len(events) - 1

    directory = unpack_recording(gw, sb.id, tmp_path, ready=marked)
    events: list[dict[str, Any]] = [dict(e) for e in read_bundle(directory).events]
    kinds = [e.get("event") for e in events]
    assert kinds.count("pause") == 1 and kinds.count("resume") == 1
    pause, resume = events[kinds.index("pause")], events[kinds.index("resume")]
    assert kinds.index("pause") < kinds.index("resume")
    assert set(pause["saved"]) == {"/workspace", "/home/agent"} and pause["tabs"] == 1
    assert resume["saved"] == pause["saved"]
    after = events[kinds.index("resume") + 1 :]
    assert any(e.get("event", "action") == "action" and e.get("controller_seq") for e in after)


def test_a_paused_session_frees_its_slot(small_gw: RunningGateway) -> None:
    with small_gw.client() as c:
        first = c.post("/v1/sessions", json={"allow": ["allowed.test"]}).json()
        assert _code(c.post("/v1/sessions", json={})) == (429, "too_many_sessions")
        assert c.post(f"/v1/sessions/{first['id']}/pause").json()["state"] == "paused"
        second = c.post("/v1/sessions", json={})  # the paused one holds no slot
        assert second.status_code == 201, second.text
        assert _code(c.post(f"/v1/sessions/{first['id']}/resume", json={})) == (429, "too_many_sessions")
        assert _code(c.post(f"/v1/sessions/{second.json()['id']}/pause")) == (429, "too_many_paused")
        c.delete(f"/v1/sessions/{second.json()['id']}")
    saved = small_gw.settings.data_dir / "paused" / first["id"]
    assert sorted(p.name for p in saved.iterdir()) == ["home-agent.tar", "workspace.tar"]
    assert {p.stat().st_mode & 0o777 for p in saved.iterdir()} == {0o600}


def test_a_paused_session_expires(upstream: Upstream, runtime: DockerHarness, tmp_path: Path) -> None:
    # A gateway of its own with a short expiry (counted from the pause's start): the slot test above
    # needs its paused session for longer than a cold start under load, and waiting that out here
    # took 40 s.
    instance = f"pause-expiry-{os.getpid()}"
    try:
        with gateway_to(upstream, tmp_path, instance, paused_ttl_s=6) as expiring, expiring.client() as c:
            made = c.post("/v1/sessions", json={"allow": ["allowed.test"]}).json()
            assert c.post(f"/v1/sessions/{made['id']}/pause").json()["state"] == "paused"
            deadline = time.monotonic() + 60
            while c.get(f"/v1/sessions/{made['id']}").status_code != 404:
                assert time.monotonic() < deadline, "the paused session did not expire"
                time.sleep(0.25)
            assert not (expiring.settings.data_dir / "paused" / made["id"]).exists()
            assert made["id"] not in runtime.proxy_states({"corral.session": made["id"]})
    finally:
        runtime.remove_all({"corral.gateway": instance})


def test_an_idle_session_pauses_and_resumes(gw: RunningGateway) -> None:
    with gw.client() as c:
        made = c.post("/v1/sessions", json={"idle_timeout_s": 2, "idle_action": "pause"}).json()
    try:
        assert made["idle_action"] == "pause"
        _wait_state(gw, made["id"], "paused")
        with gw.client() as c:
            resumed = c.post(f"/v1/sessions/{made['id']}/resume", json={})
            assert resumed.status_code == 200, resumed.text
            reply = c.post(f"/v1/sessions/{made['id']}/actions", json={"action": {"type": "tabs"}})
        assert reply.json()["ok"] is True
    finally:
        with gw.client() as c:
            c.delete(f"/v1/sessions/{made['id']}")


def test_a_restarted_gateway_finds_the_paused_session_and_asks_for_its_secrets(
    tmp_path: Path, upstream: Upstream, runtime: DockerHarness
) -> None:
    instance = f"pause-restart-{os.getpid()}"
    secret = {"value": "sk-live-9f8e7d6c5b4a39281706", "allow": ["allowed.test"]}
    try:
        with gateway_to(upstream, tmp_path, instance) as first, first.client() as c:
            made = c.post("/v1/sessions", json={"allow": ["allowed.test"], "secrets": {"API_TOKEN": secret}})
            session_id, token = made.json()["id"], made.json()["token"]
            assert c.post(f"/v1/sessions/{session_id}/pause").status_code == 200
        with gateway_to(upstream, tmp_path, instance) as again:
            with again.client(token) as agent, again.client() as owner:  # the token read back from its record
                assert agent.get(f"/v1/sessions/{session_id}").json()["state"] == "paused"
                refused = owner.post(f"/v1/sessions/{session_id}/resume", json={})
                assert _code(refused) == (409, "secrets_missing")
                assert "API_TOKEN" in refused.json()["error"]["message"]
                assert secret["value"] not in refused.text
                # A resume, and the values, are the owner's: the session's own token may do neither.
                given = {"secrets": {"API_TOKEN": secret["value"]}}
                assert agent.post(f"/v1/sessions/{session_id}/resume", json={}).status_code == 403
                assert agent.post(f"/v1/sessions/{session_id}/resume", json=given).status_code == 403
                resumed = owner.post(f"/v1/sessions/{session_id}/resume", json=given)
                assert resumed.status_code == 200, resumed.text
                assert resumed.json()["secrets"]["API_TOKEN"].startswith("corral_secret_")
                echo = agent.post(
                    f"/v1/sessions/{session_id}/actions",
                    json={"action": {"type": "exec", "command": "echo $API_TOKEN"}},
                ).json()
            assert echo["result"]["stdout"].startswith("corral_secret_")  # the placeholder, never the value
    finally:
        runtime.remove_all({"corral.gateway": instance})


async def test_the_async_sandbox_pauses_and_resumes(gw: RunningGateway) -> None:
    async with await AsyncSandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as box:
        await box.exec("echo async > /workspace/a.txt")
        assert (await box.pause()).state == "paused"
        assert (await box.resume()).state == "ready"
        assert (await box.exec("cat /workspace/a.txt")).stdout == "async\n"  # over the reopened WebSocket
