"""The downloads API against the real images (docs/downloads.md): every download of the sandbox's
browser, whoever started it (a native navigate or click, Playwright and Puppeteer over CDP), is listed
and fetched through the gateway with its cause; the caps cancel and mark; the audit chain holds
each one; an agent-uid process that swaps a download for a link or another file gets nothing out;
bad ids and other sessions' tokens are refused with structured errors."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import sync_playwright

from corral.contracts import auth
from corral.sdk import Sandbox

from .cdpwire import bearer
from .dockerutil import DockerHarness
from .egress_fixtures import Upstream, gateway_to, session_fixtures
from .gateway_fixtures import KEY_A, KEY_B, RunningGateway

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")

upstream, gw, sb = session_fixtures("downloads")
FRAMEWORKS = Path(__file__).parent / "frameworks"
PUPPETEER_DOWNLOAD = FRAMEWORKS / "puppeteer_download.mjs"
BROWSER_USE_PYTHON = Path(__file__).resolve().parents[2] / ".venv-browser-use" / "bin" / "python"
BROWSER_USE_DOWNLOAD = FRAMEWORKS / "browser_use_download.py"
# browser-use's telemetry, cloud sync, version check and hints off (as test_cdp_frameworks.py runs it).
QUIET = {
    "ANONYMIZED_TELEMETRY": "false",
    "BROWSER_USE_CLOUD_SYNC": "false",
    "BROWSER_USE_VERSION_CHECK": "false",
    "BROWSER_USE_CLOUD_HINTS": "false",
    "BROWSER_USE_LOGGING_LEVEL": "warning",
}


def expected(name: str) -> bytes:
    """What the fake upstream's ``/download/<name>`` sends."""
    return ("corral download " + name + "\n").encode() * 64


def records(gw: RunningGateway, session_id: str, event: str) -> list[dict[str, Any]]:
    with gw.client() as c:
        log = c.get(f"/v1/sessions/{session_id}/traffic")
    assert log.status_code == 200, log.text
    return [r for line in log.text.splitlines() if line and (r := json.loads(line))["event"] == event]


def audited(gw: RunningGateway, session_id: str, download_id: str, changes: set[str]) -> list[dict[str, Any]]:
    """The session's ``download`` records of ``download_id``, once they hold each of ``changes``."""
    deadline = time.monotonic() + 10
    while True:
        mine = [r for r in records(gw, session_id, "download") if r["download"] == download_id]
        if changes <= {r["change"] for r in mine}:
            return mine
        assert time.monotonic() < deadline, mine
        time.sleep(0.2)


def test_navigate_to_an_attachment_answers_with_the_download(gw: RunningGateway, sb: Sandbox) -> None:
    url = "https://allowed.test/download/navigated.bin"
    with gw.client() as c:
        answer = c.post(f"/v1/sessions/{sb.id}/actions", json={"action": {"type": "navigate", "url": url}})
    assert answer.status_code == 200, answer.text
    reply = answer.json()
    download = reply["result"]["download"]
    assert (download["name"], download["url"], download["state"]) == ("navigated.bin", url, "completed")
    assert download["size"] == len(expected("navigated.bin"))
    assert download["cause"] == {"kind": "action", "action_id": reply["action_id"], "action": "navigate", "actor": None}
    assert sb.downloads.read(download["id"]) == expected("navigated.bin")
    # The agent's copy is where it always was.
    listed = sb.exec("ls -l /home/agent/Downloads").stdout
    assert "navigated.bin" in listed
    mine = audited(gw, sb.id, download["id"], {"started", "completed", "fetched"})
    started = next(r for r in mine if r["change"] == "started")
    assert (started["action"], started["actor"], started["url"]) == (reply["action_id"], "agent", url)
    fetched = next(r for r in mine if r["change"] == "fetched")
    assert (fetched["actor"], fetched["bytes"]) == ("api-key:owner", len(expected("navigated.bin")))


def test_a_native_click_on_a_download_link_is_listed_with_its_action(
    gw: RunningGateway, sb: Sandbox, tmp_path: Path
) -> None:
    sb.navigate("https://allowed.test/page/download-link.html")
    since = time.time()
    clicked = sb.request({"action": {"type": "click", "x": 300, "y": 300}})
    found = sb.downloads.wait(name="clicked-report.bin", since=since - 1)
    assert found.state == "completed" and found.mime_type == "application/octet-stream"
    assert found.cause.kind == "action" and found.cause.action == "click"
    assert found.cause.action_id == clicked["action_id"]
    saved = sb.downloads.save(found.id, tmp_path / "report.bin")
    assert saved.path.read_bytes() == expected("clicked-report.bin") and saved.size == found.size


def test_playwright_over_cdp_gets_the_download_event_and_the_file_through_the_api(
    gw: RunningGateway, sb: Sandbox
) -> None:
    with sync_playwright() as p:
        browser = p.chromium.connect_over_cdp(f"{gw.url}/v1/sessions/{sb.id}/cdp", headers=bearer(sb), timeout=30_000)
        try:
            context = browser.contexts[0]
            page = context.pages[0] if context.pages else context.new_page()
            page.goto("https://allowed.test/page/download-link.html")
            with page.expect_download(timeout=20_000) as info:
                page.click("#get")
            download = info.value
            assert download.suggested_filename == "clicked-report.bin"
            assert download.failure() is None  # Chromium saved it, in Corral's place
            # Playwright's own save_as reads a file on this machine, which never had it (docs/cdp.md).
            with pytest.raises(PlaywrightError):
                download.save_as("/nonexistent-dir/x.bin")
            found = sb.downloads.wait(url=download.url)
        finally:
            browser.close()
    assert sb.downloads.read(found.id) == expected("clicked-report.bin")
    assert found.cause.kind == "cdp" and (found.cause.actor or "").startswith("cdp:")


def test_a_download_in_a_context_playwright_made_lands_in_corrals_place_too(gw: RunningGateway, sb: Sandbox) -> None:
    with sync_playwright() as p:
        browser = p.chromium.connect_over_cdp(f"{gw.url}/v1/sessions/{sb.id}/cdp", headers=bearer(sb), timeout=30_000)
        try:
            context = browser.new_context()
            page = context.new_page()
            page.goto("https://allowed.test/page/download-link.html")
            with page.expect_download(timeout=20_000) as info:
                page.click("#get")
            download = info.value
            assert download.failure() is None
            found = sb.downloads.wait(url=download.url, since=time.time() - 30)
            context.close()
        finally:
            browser.close()
    assert found.state == "completed" and found.cause.kind == "cdp"
    assert sb.downloads.read(found.id) == expected("clicked-report.bin")


@pytest.fixture(scope="module")
def frameworks() -> None:
    if not (FRAMEWORKS / "node_modules" / "puppeteer-core").is_dir():
        pytest.skip("tests/integration/frameworks/node_modules is not installed (npm ci there)")


@pytest.mark.usefixtures("frameworks")
def test_puppeteer_download_behaviour_lands_in_corrals_place(gw: RunningGateway, sb: Sandbox, tmp_path: Path) -> None:
    """Puppeteer's documented form (``Browser.setDownloadBehavior`` to a folder of its machine) and its
    events: the file is listed and fetched through the API, the folder it named never used."""
    cdp_url = f"{gw.ws}/v1/sessions/{sb.id}/cdp"
    page = "https://allowed.test/page/download-link.html"
    done = asyncio.run(_run_node(str(PUPPETEER_DOWNLOAD), cdp_url, sb.info.token or "", page, str(tmp_path / "x")))
    assert done["state"] == "completed" and done["suggested"] == "clicked-report.bin", done
    found = sb.downloads.wait(url=done["url"])
    assert sb.downloads.read(found.id) == expected("clicked-report.bin")
    assert found.id == done["guid"] and found.cause.kind == "cdp"
    assert not (tmp_path / "x").exists()


def test_browser_use_s_download_is_fetched_by_the_guid_it_reports(
    gw: RunningGateway, sb: Sandbox, tmp_path: Path
) -> None:
    """browser-use (0.13) reports a remote browser's download at a path on this machine with
    ``file_size`` 0 (the issue's "0 bytes"); its event's GUID is the download's id in Corral, whose API
    has the bytes."""
    if not BROWSER_USE_PYTHON.exists():
        pytest.skip(".venv-browser-use is not installed (scripts/bootstrap-frameworks)")
    cdp_url = f"{gw.url}/v1/sessions/{sb.id}/cdp"
    page = "https://allowed.test/page/download-link.html"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config"), **QUIET}
    argv = [str(BROWSER_USE_PYTHON), str(BROWSER_USE_DOWNLOAD), cdp_url, sb.info.token or ""]
    event = asyncio.run(_run(*argv, page, str(tmp_path / "dl"), env=env))
    assert event["url"] == "https://allowed.test/download/clicked-report.bin", event
    assert event["file_size"] == 0 and event["path"].endswith("clicked-report.bin")
    found = sb.downloads.get(event["guid"])
    assert found.state == "completed" and found.cause.kind == "cdp"
    assert sb.downloads.read(found.id) == expected("clicked-report.bin")


async def _run_node(*argv: str) -> dict[str, Any]:
    return await _run("node", *argv)


async def _run(*argv: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    probe = await asyncio.create_subprocess_exec(
        *argv, cwd=FRAMEWORKS, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(probe.communicate(), timeout=120)
    assert probe.returncode == 0, (out + err).decode()
    read: dict[str, Any] = json.loads(out.decode().splitlines()[-1])
    return read


def test_a_download_swapped_for_a_link_or_another_file_gives_nothing(gw: RunningGateway, sb: Sandbox) -> None:
    """An agent-uid process replaces the saved file with a symlink to /etc/shadow, to the controller's
    secret, or with a file of its own: the fetch is refused (409), never following or serving it."""
    url = "https://allowed.test/download/swapped.bin"
    first = sb.navigate(url)
    assert first.download is not None
    download = first.download
    target = download.path
    assert target == "/home/agent/Downloads/swapped.bin"
    for swap in (
        f"ln -sfn /etc/shadow {target}",
        f"ln -sfn {auth.SECRET_FILE} {target}",
        f"rm -f {target} && printf 'not the download' > {target}",
    ):
        assert sb.exec(swap).exit_code == 0
        with gw.client() as c:
            refused = c.get(f"/v1/sessions/{sb.id}/downloads/{download.id}")
        assert refused.status_code == 409, (swap, refused.text)
        assert refused.json()["error"]["code"] == "download_unavailable"
    # Gone altogether: 404, structured.
    assert sb.exec(f"rm -f {target}").exit_code == 0
    with gw.client() as c:
        gone = c.get(f"/v1/sessions/{sb.id}/downloads/{download.id}")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "no_such_download", gone.text


def test_bad_ids_and_credentials(gw: RunningGateway, sb: Sandbox) -> None:
    with gw.client() as c:
        for bad in ("not-a-download-id", "bad%21id", "x" * 65):
            answer = c.get(f"/v1/sessions/{sb.id}/downloads/{bad}")
            assert answer.status_code == 404, answer.text
            assert answer.json()["error"]["code"] == "no_such_download"
    token = sb.info.token or ""
    with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {token}"}) as own:
        assert own.get(f"/v1/sessions/{sb.id}/downloads").status_code == 200  # the session's own token
    with Sandbox.create(url=gw.url, api_key=KEY_A) as other:  # live: its token is a good one, for its session
        bearer_other = {"Authorization": f"Bearer {other.info.token or ''}"}
        with httpx.Client(base_url=gw.url, headers=bearer_other) as stranger:
            refused = stranger.get(f"/v1/sessions/{sb.id}/downloads")
            refused_bytes = stranger.get(f"/v1/sessions/{sb.id}/downloads/{'0' * 36}")
    assert refused_bytes.status_code == 403
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden", refused.text
    with gw.client(KEY_B) as another_key:
        assert another_key.get(f"/v1/sessions/{sb.id}/downloads").status_code in (403, 404)


@pytest.fixture(scope="module")
def capped_gw(
    tmp_path_factory: pytest.TempPathFactory, upstream: Upstream, runtime: DockerHarness
) -> Iterator[RunningGateway]:
    instance = f"downloads-capped-{os.getpid()}"
    with gateway_to(
        upstream, tmp_path_factory.mktemp("capped-gw"), instance, download_max_file_mb=1, download_max_session_mb=2
    ) as running:
        yield running
    runtime.remove_all({"corral.gateway": instance})


def test_the_caps_cancel_and_mark_a_download(capped_gw: RunningGateway) -> None:
    with Sandbox.create(url=capped_gw.url, api_key=KEY_A, allow=["allowed.test"]) as box:
        over = box.navigate("https://allowed.test/download/big.bin?bytes=3000000").download
        assert over is not None and over.state == "capped", over
        assert "per download" in (over.error or "")
        with capped_gw.client() as c:
            refused = c.get(f"/v1/sessions/{box.id}/downloads/{over.id}")
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "download_unavailable"
        # The session's cap: two of 0.9 MB fit, the third would pass 2 MB.
        states = []
        for n in range(3):
            got = box.navigate(f"https://allowed.test/download/part{n}.bin?bytes=900000").download
            assert got is not None
            states.append(got.state)
        assert states == ["completed", "completed", "capped"], states
        with capped_gw.client() as c:
            listing = c.get(f"/v1/sessions/{box.id}/downloads").json()
        assert (listing["max_file_bytes"], listing["max_session_bytes"]) == (1 << 20, 2 << 20)
        assert listing["total_bytes"] == 1_800_000
        capped = records(capped_gw, box.id, "download")
        assert {r["download"] for r in capped if r["change"] == "capped"} >= {over.id}
