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
from corral.sdk import Sandbox

from .conftest import html_url
from .dockerutil import DockerHarness
from .gateway_fixtures import KEY_A, KEY_B, RunningGateway, gateway, replay_cli, unpack_recording

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
        sb.act({"type": "navigate", "url": page}, wait_for="stable", screenshot=True)
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
    gw: RunningGateway, runtime: DockerHarness, tmp_path: Path
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


# A page whose reaction to Enter the second version changes: only the step that presses it differs.
PAGE = (
    "<input id=box style='font-size:24px;margin:40px'><div id=out style='font-size:48px'></div>",
    "document.getElementById('box').addEventListener('keydown', e => { if (e.key === 'Enter') {"
    " document.getElementById('out').textContent = '{text}';"
    " document.body.style.background = '{color}'; } });",
)


def _page(text: str, color: str) -> str:
    body, script = PAGE
    return html_url(body, script.replace("{text}", text).replace("{color}", color))


def _edit_events(directory: Path, edit: object) -> None:
    events = directory / "events.jsonl"
    lines = [json.loads(line) for line in events.read_text().splitlines() if line]
    events.write_text("".join(json.dumps(e) + "\n" for e in edit(lines)))  # type: ignore[operator]


@pytest.fixture(scope="module")
def recorded(gw: RunningGateway, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scripted session, recorded and downloaded: navigate, click, type, Enter."""

    with Sandbox.create(url=gw.url, api_key=KEY_A) as sb:
        sb.act({"type": "navigate", "url": _page("done", "#cfc")}, wait_for="stable", screenshot=True)
        # As an agent acts: each step waits for the screen it then looks at (the dialects do so by default).
        sb.act({"type": "click", "x": 150, "y": 145}, wait_for="stable", screenshot=True)  # the input
        sb.act({"type": "type", "text": "hello"}, wait_for="stable", screenshot=True)
        sb.act({"type": "key", "keys": "Return"}, wait_for="stable", screenshot=True)
        session_id = sb.id
    directory = unpack_recording(gw, session_id, tmp_path_factory.mktemp("recorded"))
    assert len(read_bundle(directory).actions) == 4
    return directory


def test_a_recording_replays_cleanly(gw: RunningGateway, recorded: Path, tmp_path: Path) -> None:
    code, junit, report = replay_cli(gw, recorded, tmp_path)
    assert code == 0, report
    assert 'tests="4"' in junit and 'failures="0"' in junit


def test_an_altered_frame_fails_exactly_that_step(gw: RunningGateway, recorded: Path, tmp_path: Path) -> None:
    import shutil

    altered = tmp_path / "altered"
    shutil.copytree(recorded, altered)
    frame = altered / read_bundle(altered).actions[1]["frame"]
    image = Image.open(frame).convert("RGB")
    image.paste((0, 0, 0), (0, 0, image.width // 2, image.height // 2))
    image.save(frame, "WEBP")
    code, junit, report = replay_cli(gw, altered, tmp_path)
    assert code == 1
    assert 'failures="1"' in junit and "step 2:" in junit.split("<failure")[0].rsplit("<testcase", 1)[1]
    assert "Step 2: click" in report and report.count("DIVERGED") == 1 and "1 step(s) diverged" in report


def test_a_changed_page_fails_exactly_the_step_that_shows_it(
    gw: RunningGateway, recorded: Path, tmp_path: Path
) -> None:
    import shutil

    changed = tmp_path / "changed"
    shutil.copytree(recorded, changed)

    def point_at_the_new_page(events: list[dict[str, object]]) -> list[dict[str, object]]:
        request = events[0]["request"]
        assert isinstance(request, dict)
        request["action"]["url"] = _page("SOMETHING ELSE ENTIRELY", "#222")
        return events

    _edit_events(changed, point_at_the_new_page)
    code, junit, _ = replay_cli(gw, changed, tmp_path)
    assert code == 1 and 'failures="1"' in junit
    failing = junit.split("<failure")[0].rsplit("<testcase", 1)[1]
    assert "step 4: key" in failing


def test_a_bundle_cut_short_replays_to_its_end_and_foreign_ones_get_a_clear_error(
    gw: RunningGateway, recorded: Path, tmp_path: Path
) -> None:
    import shutil

    cut = tmp_path / "cut"
    shutil.copytree(recorded, cut)
    _edit_events(cut, lambda events: events[:2])
    with (cut / "events.jsonl").open("a") as events:
        events.write('{"seq": 3, "event": "acti')
    code, junit, report = replay_cli(gw, cut, tmp_path)
    assert code == 0 and 'tests="2"' in junit, report
    foreign = tmp_path / "foreign.zip"
    foreign.write_bytes(b"PK\x05\x06" + b"\0" * 18)  # an empty zip
    code, _, output = replay_cli(gw, foreign, tmp_path / "x")
    assert code == 2 and "not a Corral recording" in output and "Traceback" not in output


@pytest.mark.parametrize("suffix", [".mp4", ".webm"])
def test_a_recording_exports_as_a_video_at_its_timing(recorded: Path, tmp_path: Path, suffix: str) -> None:
    import subprocess
    import sys

    import imageio_ffmpeg

    target = tmp_path / f"session{suffix}"
    done = subprocess.run(
        [sys.executable, "-m", "corral.cli", "export", "video", str(recorded), "-o", str(target)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    frames, seconds = imageio_ffmpeg.count_frames_and_secs(str(target))
    bundle = read_bundle(recorded)
    recorded_span = bundle.actions[-1]["frame_at"] - bundle.actions[0]["frame_at"] + 1.0
    assert frames >= 4 and abs(seconds - recorded_span) < 0.5, (frames, seconds, recorded_span)


# -- bounds and privacy (issue 10) ---------------------------------------------------------------------

PROXY_UID = 4321  # not the image's egress user: the uid is the gateway's setting


@pytest.fixture(scope="module")
def guarded() -> Iterator[RunningGateway]:
    """A gateway whose data dir sits in a directory every host user may enter (as a home dir may be),
    so only the data dir's own modes keep other users out."""
    import shutil
    import tempfile

    outer = Path(tempfile.mkdtemp(prefix="corral-open-", dir="/tmp"))
    outer.chmod(0o755)
    try:
        with gateway(outer / "data", f"recb-{os.getpid()}", egress_uid=PROXY_UID) as running:
            yield running
    finally:
        shutil.rmtree(outer, ignore_errors=True)


def _tree_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def _flood(gw: RunningGateway, session_id: str, count: int) -> None:
    """What the page did: big requests, each refused and recorded as received (900 KB, under the
    sandbox's 1 MiB)."""
    body = {"id": "flood", "action": {"type": "click", "x": -5, "y": 3}, "pad": ["a" * 9000] * 100}
    with gw.client() as c:
        for _ in range(count):
            response = c.post(f"/v1/sessions/{session_id}/actions", json=body)
            assert response.status_code == 400 and response.json()["error"]["field"] == "pad"


def _settled(gw: RunningGateway, session_id: str) -> dict[str, object]:
    """The listing's row once the recorder has caught up (its count stops moving)."""
    deadline, last = time.monotonic() + 30, None
    while True:
        with gw.client() as c:
            row = next(r for r in c.get("/v1/recordings").json() if r["session"] == session_id)
        if row == last or row.get("cut"):
            return dict(row)
        assert time.monotonic() < deadline, "the recording did not settle"
        last = row
        time.sleep(0.5)


def test_a_flood_of_big_requests_is_cut_to_the_budget_and_the_session_goes_on(
    guarded: RunningGateway, tmp_path: Path
) -> None:
    gw = guarded
    recordings = gw.settings.data_dir / "recordings"
    with gw.client() as c:
        created = c.post("/v1/sessions", json={"recording_mb": 2}).json()
        plain = c.post("/v1/sessions", json={}).json()
    try:
        _flood(gw, created["id"], 100)
        _flood(gw, plain["id"], 100)
        row = _settled(gw, created["id"])
        assert row["cut"] == "budget" and row["budget_bytes"] == 2 << 20
        directory = recordings / created["id"]
        manifest = json.loads((directory / "manifest.json").read_text())
        assert manifest["cut"]["reason"] == "budget"
        assert _tree_bytes(directory) <= (2 << 20) + (64 << 10), _tree_bytes(directory)  # the budget, and its note
        # With the default budget, each event's text is cut to the cap: 100 x 900 KB do not make 90 MB.
        _settled(gw, plain["id"])
        plain_bytes = _tree_bytes(recordings / plain["id"])
        print(f"100 x 900 KB requests recorded in {plain_bytes / (1 << 20):.1f} MiB")
        assert plain_bytes < 20 << 20
        bundle = read_bundle(recordings / plain["id"])
        assert len(bundle.actions) == 100
        assert all(e["truncated"]["request"] > 900_000 and len(e["request"]) <= 64 << 10 for e in bundle.actions)
        # The session goes on after the cut; its recording stores nothing more.
        before = {p.name: p.stat().st_size for p in directory.rglob("*") if p.is_file()}
        box = Sandbox.attach(created["id"], created["token"], url=gw.url)
        try:
            assert box.screenshot() and box.click(10, 10) is not None
        finally:
            box.close()
        with gw.client() as c:
            assert c.get(f"/v1/sessions/{created['id']}").json()["state"] == "ready"
        assert {p.name: p.stat().st_size for p in directory.rglob("*") if p.is_file()} == before
    finally:
        with gw.client() as c:
            c.delete(f"/v1/sessions/{created['id']}")
            c.delete(f"/v1/sessions/{plain['id']}")
    zipped = read_bundle(_download(gw, created["id"], tmp_path / "cut.zip"))
    assert zipped.events[-1]["event"] == "budget" and zipped.manifest["ended_at"]


# Run as another host user: try to read each path; say what happened to each.
_PROBE = """
import json, os, sys
out = {}
for path in sys.argv[1:]:
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            open(path, "rb").read(1)
        out[path] = "read"
    except OSError as exc:
        out[path] = type(exc).__name__
print(json.dumps(out))
"""


def _as_nobody(*paths: Path) -> dict[str, str]:
    import subprocess

    done = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            _PROBE,
            *map(str, paths),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    result: dict[str, str] = json.loads(done.stdout)
    return result


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another host user needs root")
def test_another_host_user_reads_nothing_of_the_data_dir_and_no_file_holds_a_proxy_token(
    guarded: RunningGateway, runtime: DockerHarness
) -> None:
    gw = guarded
    data = gw.settings.data_dir
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as sb:
        sb.navigate(html_url("<p>private</p>", "document.title='private'"))
        sb.act({"type": "navigate", "url": "https://blocked.test/"})
        # The proxy runs as the configured uid, owns its state and still logs and takes policy changes.
        proxy = runtime.client.containers.get(f"corral-egress-{sb.id}")
        assert proxy.attrs["Config"]["User"] == f"{PROXY_UID}:{PROXY_UID}"
        state = data / "egress" / sb.id
        assert state.stat().st_uid == PROXY_UID and (state.stat().st_mode & 0o777) == 0o700
        with gw.client() as c:
            assert c.patch(f"/v1/sessions/{sb.id}", json={"allow": ["allowed.test", "more.test"]}).status_code == 200
            deadline = time.monotonic() + 15
            while "blocked.test" not in c.get(f"/v1/sessions/{sb.id}/traffic").text:
                assert time.monotonic() < deadline, "the proxy logged nothing"
                time.sleep(0.2)
        _wait_actions(gw, sb.id, Path(data.parent), 2)
        # Both containers' json-file logs are capped.
        sandbox = runtime.client.containers.get(sb.container)
        for container in (proxy, sandbox):
            config = container.attrs["HostConfig"]["LogConfig"]
            assert config == {"Type": "json-file", "Config": {"max-size": "10m", "max-file": "3"}}, config
        token = next(e.split("=", 1)[1] for e in proxy.attrs["Config"]["Env"] if e.startswith("CORRAL_GATEWAY_TOKEN="))
        recording = data / "recordings" / sb.id
        frame = next((recording / "frames").iterdir())
        targets = [
            data,
            data / "sessions",
            data / "sessions" / f"{sb.id}.json",
            recording / "events.jsonl",
            recording / "manifest.json",
            frame,
            state / "policy.json",
            state / "audit.jsonl",
            data / "egress-token.key",
        ]
        assert all(path.exists() for path in targets)
        seen = _as_nobody(*targets)
        assert set(seen.values()) == {"PermissionError"}, seen
        # Even for root, no file in the data dir holds the proxy's token in plain text.
        holders = [p for p in data.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
        assert holders == []
        dirs = {p.relative_to(data): p.stat().st_mode & 0o777 for p in data.rglob("*") if p.is_dir()}
        assert set(dirs.values()) == {0o700}, dirs
        files = {p.relative_to(data): p.stat().st_mode & 0o777 for p in data.rglob("*") if p.is_file()}
        gateway_written = {k: v for k, v in files.items() if k.parts[0] != "egress" or k.name == "session.json"}
        assert set(gateway_written.values()) == {0o600}, gateway_written


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another host user needs root")
def test_another_host_user_cannot_read_a_proxy_token_from_its_command_line(
    guarded: RunningGateway, runtime: DockerHarness
) -> None:
    import subprocess

    with guarded.client() as c:
        created = c.post("/v1/sessions", json={}).json()
        try:
            proxy = runtime.client.containers.get(f"corral-egress-{created['id']}")
            env = dict(e.split("=", 1) for e in proxy.attrs["Config"]["Env"])
            # The token comes in on stdin: on the command line the scanner would find itself.
            scan = (
                "import os, sys\n"
                "token = sys.stdin.read().encode()\n"
                "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
                "    try:\n"
                "        line = open(f'/proc/{pid}/cmdline', 'rb').read()\n"
                "    except OSError:\n"
                "        continue\n"
                "    if int(pid) != os.getpid() and token in line:\n"
                "        print(pid, line[:200])\n"
            )
            done = subprocess.run(
                ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", scan],
                input=env["CORRAL_GATEWAY_TOKEN"],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            )
            assert done.stdout.strip() == "", "an unprivileged host user read the proxy's token"
        finally:
            c.delete(f"/v1/sessions/{created['id']}")


def test_a_restarted_gateway_derives_its_proxy_tokens_again(tmp_path: Path) -> None:
    """Nothing on disk holds a proxy's token, yet a restarted gateway still drives the proxies."""
    data, instance = tmp_path / "data", f"rect-{os.getpid()}"
    with gateway(data, instance) as first, first.client() as c:
        created = c.post("/v1/sessions", json={"allow": ["allowed.test"]}).json()
    with gateway(data, instance) as second, second.client() as c:
        try:
            changed = c.patch(f"/v1/sessions/{created['id']}", json={"egress_mode": "enforce", "allow": ["b.test"]})
            assert changed.status_code == 200, changed.text
            assert changed.json()["allow"] == ["b.test"]
            traffic = c.get(f"/v1/sessions/{created['id']}/traffic").text
            assert '"b.test"' in traffic  # the proxy took the change and logged it
        finally:
            c.delete(f"/v1/sessions/{created['id']}")
