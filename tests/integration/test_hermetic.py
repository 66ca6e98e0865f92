"""Hermetic replay: a recording's upstream answers come back from its own proxy, and nothing live.

A session browses a page on the fake upstream that changes on every request (a hit counter). Its
bundle carries the proxy's recorded responses. Replayed hermetically, every step matches and the
upstream is never asked; replayed live, the counter has moved on and the step that shows it
diverges. The hermetic session's proxy has no network out, answers what the recording lacks with a
"not recorded" page, and the audit log marks replayed answers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.proxy.flowfile import check
from corral.recording.bundle import read_bundle
from corral.sdk import Sandbox

from .dockerutil import DockerHarness
from .egress_fixtures import Upstream, gateway_to, start_upstream
from .gateway_fixtures import KEY_A, KEY_B, RunningGateway, unpack_recording

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")

COUNTER = "https://allowed.test/counter"


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[Upstream]:
    yield from start_upstream(runtime, tmp_path_factory.mktemp("upstream"), f"corral-egress-hm-{os.getpid()}")


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, upstream: Upstream) -> Iterator[RunningGateway]:
    with gateway_to(upstream, tmp_path_factory.mktemp("hermetic-gw"), f"hermetic-{os.getpid()}") as running:
        yield running


def _counter_hits(upstream: Upstream, runtime: DockerHarness) -> int:
    return sum(1 for hit in upstream.hits(runtime) if str(hit["path"]).startswith("/counter"))


def _wait_title(sb: Sandbox, title: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while sb.page_info().title != title:
        assert time.monotonic() < deadline, f"title is {sb.page_info().title!r}, not {title!r}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def recorded(gw: RunningGateway, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two visits to the counter page (it shows 1, then 2), recorded and downloaded as a directory."""
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as sb:
        for _ in range(2):
            sb.act({"type": "navigate", "url": COUNTER}, wait_for="stable", screenshot=True)
            _wait_title(sb, "counter")
        sb.act({"type": "scroll", "direction": "down", "clicks": 1}, wait_for="stable", screenshot=True)
        session_id = sb.id
    return unpack_recording(gw, session_id, tmp_path_factory.mktemp("recorded"))


def _replay(gw: RunningGateway, bundle: Path, tmp_path: Path, *extra: str) -> tuple[int, str, str]:
    junit = tmp_path / "junit.xml"
    done = subprocess.run(
        [sys.executable, "-m", "corral.cli", "replay", str(bundle), "--against", gw.url, "--junit", str(junit), *extra],
        env={**os.environ, "CORRAL_API_KEY": KEY_A},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return done.returncode, junit.read_text() if junit.exists() else "", done.stdout + done.stderr


def test_the_bundle_carries_the_recorded_responses(recorded: Path) -> None:
    bundle = read_bundle(recorded)
    assert bundle.responses is not None
    assert check(bundle.responses).flows >= 2  # both counter pages (and whatever else the browser asked)
    assert bundle.responses.count(b"/counter") >= 2
    assert b"secret-cookie" in bundle.responses  # the site's Set-Cookie, kept as it answered


def test_a_hermetic_replay_matches_and_never_reaches_the_upstream(
    gw: RunningGateway, recorded: Path, upstream: Upstream, runtime: DockerHarness, tmp_path: Path
) -> None:
    before = _counter_hits(upstream, runtime)
    code, junit, output = _replay(gw, recorded, tmp_path, "--hermetic")
    assert code == 0, output
    steps = len(read_bundle(recorded).actions)  # the navigations, the scroll and the title checks
    assert f'tests="{steps}"' in junit and 'failures="0"' in junit
    assert _counter_hits(upstream, runtime) == before  # answered from the recording alone


def test_a_live_replay_of_the_same_bundle_sees_the_site_changed(
    gw: RunningGateway, recorded: Path, upstream: Upstream, runtime: DockerHarness, tmp_path: Path
) -> None:
    before = _counter_hits(upstream, runtime)
    code, junit, output = _replay(gw, recorded, tmp_path)
    assert code == 1, output  # the counter moved on: the page it shows is not the recorded one
    assert _counter_hits(upstream, runtime) > before
    failing = junit.split("<failure")[0].rsplit("<testcase", 1)[1]
    assert "step 1: navigate" in failing


def test_a_hermetic_session_has_no_way_out_and_says_what_was_not_recorded(
    gw: RunningGateway, recorded: Path, runtime: DockerHarness
) -> None:
    responses = read_bundle(recorded).responses
    assert responses is not None
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"], hermetic_responses=responses) as sb:
        assert sb.info.hermetic is True
        proxy = runtime.client.containers.get(f"corral-egress-{sb.id}")
        networks = set(proxy.attrs["NetworkSettings"]["Networks"])
        assert networks == {f"corral-net-{sb.id}"}  # not on the egress network: no route to any site
        sb.act({"type": "navigate", "url": COUNTER}, wait_for="stable")
        _wait_title(sb, "counter")
        sb.act({"type": "navigate", "url": "https://allowed.test/never-visited"}, wait_for="stable")
        _wait_title(sb, "Not recorded: allowed.test")
        with gw.client() as c:
            records = [json.loads(line) for line in c.get(f"/v1/sessions/{sb.id}/traffic").text.splitlines()]
    counter = next(r for r in records if r["event"] == "request" and r["url"] == COUNTER)
    assert counter["replayed"] is True and counter["ip"] is None and counter["status"] == 200
    missing = next(r for r in records if r["event"] == "block" and r["url"].endswith("/never-visited"))
    assert (missing["rule"], missing["status"]) == ("not-recorded", 502)
    start = next(r for r in records if r["event"] == "proxy")
    assert start["hermetic"] is True and start["recorded_responses"] >= 2


def test_bad_uploads_and_foreign_ids_get_clear_errors(gw: RunningGateway, recorded: Path, tmp_path: Path) -> None:
    with gw.client() as c:
        bad = c.post("/v1/replay-responses", content=b"<html>not flows</html>")
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_request"
        assert "not a mitmproxy flow file" in bad.json()["error"]["message"]
        responses = (recorded / "responses.mitm").read_bytes()
        torn = c.post("/v1/replay-responses", content=responses + b"123:{half a flo")
        assert torn.status_code == 201 and torn.json()["torn"] is True
        assert torn.json()["bytes"] == len(responses)
        upload = torn.json()["id"]
        unknown = c.post("/v1/sessions", json={"hermetic": "rsp_0000000000000000"})
        assert unknown.status_code == 404 and unknown.json()["error"]["field"] == "hermetic"
        malformed = c.post("/v1/sessions", json={"hermetic": "../../etc/passwd"})
        assert malformed.status_code == 422
        # Framed like a flow file, but no flow mitmproxy can read: the create fails, nothing is left.
        hollow = c.post("/v1/replay-responses", content=b"14:4:type;4:http;}")
        assert hollow.status_code == 201, hollow.text
        unreadable = c.post("/v1/sessions", json={"hermetic": hollow.json()["id"]})
        assert unreadable.status_code == 422, unreadable.text
        assert (unreadable.json()["error"]["code"], unreadable.json()["error"]["field"]) == (
            "replay_unreadable",
            "hermetic",
        )
        assert c.get("/v1/sessions").json() == []
    with gw.client(KEY_B) as other:
        stolen = other.post("/v1/sessions", json={"hermetic": upload})
        assert stolen.status_code == 404  # another key's upload does not exist for this one
        assert other.delete(f"/v1/replay-responses/{upload}").status_code == 404
    with gw.client() as c:
        assert c.delete(f"/v1/replay-responses/{upload}").status_code == 204
        assert c.post("/v1/sessions", json={"hermetic": upload}).status_code == 404
    without = tmp_path / "without"
    shutil.copytree(recorded, without)
    (without / "responses.mitm").unlink()
    code, _, output = _replay(gw, without, tmp_path, "--hermetic")
    assert code == 2 and "holds no recorded responses" in " ".join(output.split()) and "Traceback" not in output
