"""Every session is recorded: the bundle written as the session goes, read back with read_bundle."""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from corral.recording.bundle import read_bundle
from corral.runtime.docker import DockerRuntime
from corral.sdk import Sandbox

from .conftest import html_url
from .gateway_fixtures import KEY_A, KEY_B, RunningGateway, gateway

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    with gateway(tmp_path_factory.mktemp("rec-gw"), f"rec-{os.getpid()}") as running:
        yield running


def _download(gw: RunningGateway, session_id: str, target: Path, key: str = KEY_A) -> Path:
    with gw.client(key) as c:
        response = c.get(f"/v1/sessions/{session_id}/recording")
    assert response.status_code == 200, response.text
    target.write_bytes(response.content)
    return target


def _wait_actions(gw: RunningGateway, session_id: str, tmp_path: Path, count: int) -> None:
    deadline = time.monotonic() + 15
    while len(read_bundle(_download(gw, session_id, tmp_path / "poll.zip")).actions) < count:
        assert time.monotonic() < deadline, "the recording did not catch up"
        time.sleep(0.2)


def test_a_session_is_recorded_as_it_goes(gw: RunningGateway, tmp_path: Path) -> None:
    page = html_url("<h1>one</h1><input id=box>", "document.title='one'")
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as sb:
        sb.navigate(page)
        sb.click(200, 150)
        sb.act({"type": "type", "text": "hi"})
        sb.run_anthropic({"action": "screenshot"})
        bad = sb._ws.request({"id": "bad-1", "action": {"type": "click", "x": -5, "y": 3}})
        assert bad["ok"] is False
        blocked = sb.act({"type": "navigate", "url": "https://blocked.test/"})
        _wait_actions(gw, sb.id, tmp_path, 6)
        live = read_bundle(_download(gw, sb.id, tmp_path / "live.zip"))
        with gw.client(KEY_B) as other:
            assert other.get(f"/v1/sessions/{sb.id}/recording").status_code == 403
    bundle = read_bundle(_download(gw, sb.id, tmp_path / "ended.zip"))
    assert bundle.manifest["viewport"] == {"width": 1280, "height": 800}
    assert bundle.manifest["allow"] == ["allowed.test"] and bundle.manifest["ended_at"]
    assert len(bundle.actions) >= len(live.actions) >= 6
    first, click, typed, shot, failed, refused = bundle.actions[:6]
    assert first["native"][0]["type"] == "navigate" and first["title"] == "one" and first["ok"] is True
    assert click["native"][0] == {"type": "click", "x": 200, "y": 150, "button": "left"} | {
        k: v for k, v in click["native"][0].items() if k not in ("type", "x", "y", "button")
    }
    assert typed["request"]["action"] == {"type": "type", "text": "hi"}
    assert shot["dialect"] == "anthropic" and shot["request"]["anthropic"] == {"action": "screenshot"}
    assert "<image>" in json.dumps(shot["reply"])  # images are not kept twice
    assert failed["ok"] is False and failed["error"]["field"].startswith("action.x")
    assert refused["action_id"] == blocked["action_id"]
    # The audit records that navigate caused: the refused CONNECT and its block, by seq.
    with gw.client() as c:
        traffic = [json.loads(line) for line in c.get(f"/v1/sessions/{sb.id}/traffic").text.splitlines()]
    caused = {r["seq"]: r for r in traffic if r["seq"] in refused["audit"]}
    assert caused and all(r["action"] == blocked["action_id"] for r in caused.values())
    assert any(r["host"] == "blocked.test" and r["decision"] == "deny" for r in caused.values())
    frame = bundle.frame(first)
    assert frame is not None and frame[:4] == b"RIFF" and frame[8:12] == b"WEBP"
    assert Image.open(io.BytesIO(frame)).size == (640, 400)
    with gw.client() as c:
        listed = {r["session"]: r for r in c.get("/v1/recordings").json()}
    assert listed[sb.id]["state"] == "ended" and listed[sb.id]["events"] >= 6


def test_a_killed_session_leaves_a_bundle_readable_to_its_end(
    gw: RunningGateway, runtime: DockerRuntime, tmp_path: Path
) -> None:
    with gw.client() as c:
        created = c.post("/v1/sessions", json={}).json()
    box = Sandbox.attach(created["id"], created["token"], url=gw.url)
    try:
        box.navigate(html_url("<p>two</p>", "document.title='two'"))
        box.click(100, 100)
        _wait_actions(gw, created["id"], tmp_path, 2)
        runtime.kill(created["container"])  # the sandbox dies mid-session
    finally:
        box.close()
    directory = gw.settings.data_dir / "recordings" / created["id"]
    with (directory / "events.jsonl").open("ab") as events:
        events.write(b'{"seq": 99, "event": "act')  # and a write cut short
    bundle = read_bundle(directory)
    assert bundle.truncated and [a["native"][0]["type"] for a in bundle.actions] == ["navigate", "click"]
    with gw.client() as c:
        c.delete(f"/v1/sessions/{created['id']}")
