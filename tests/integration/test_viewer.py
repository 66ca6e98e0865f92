"""The session viewer page, in a real Chromium (Debian's, on the host) driven by Playwright."""

from __future__ import annotations

import json
import os
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from corral.gateway.viewer import POLL_MS
from corral.recording.bundle import read_bundle
from corral.sdk import Sandbox

from .conftest import html_url
from .gateway_fixtures import KEY_A, KEY_B, RunningGateway, gateway

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    with gateway(tmp_path_factory.mktemp("viewer-gw"), f"viewer-{os.getpid()}") as running:
        yield running


@dataclass(frozen=True)
class Recorded:
    session_id: str
    blocked_action: str


@pytest.fixture(scope="module")
def recorded(gw: RunningGateway) -> Recorded:
    """An ended session of three actions; the last one is a refused navigation."""
    with Sandbox.create(url=gw.url, api_key=KEY_A) as sb:
        sb.act(
            {"type": "navigate", "url": html_url("<h1>first</h1>", "document.title='first'")},
            screenshot=True,
            wait_for="stable",
        )
        sb.act({"type": "click", "x": 300, "y": 300}, screenshot=True, wait_for="stable")
        blocked = sb.act({"type": "navigate", "url": "https://blocked.test/page"}, screenshot=True, wait_for="stable")
        session_id = sb.id
    assert len(read_bundle(Path(gw.settings.data_dir / "recordings" / session_id)).actions) == 3
    return Recorded(session_id, str(blocked["action_id"]))


class Watched:
    """A page with everything it requests and logs recorded."""

    def __init__(self, browser: Any) -> None:
        self.page = browser.new_page()
        self.requests: list[Any] = []
        self.events_log: list[tuple[str, str]] = []  # ("start" | "end", url) of events requests, in order
        self.console: list[str] = []
        self.failed: list[str] = []  # "status url" of every answer >= 400
        self.page.on("request", self._request)
        self.page.on("requestfinished", lambda r: self._ended(r))
        self.page.on("requestfailed", lambda r: self._ended(r))
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text} @ {m.location.get('url')}"))
        self.page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))
        self.page.on("response", lambda r: r.status >= 400 and self.failed.append(f"{r.status} {r.url}"))

    def _request(self, request: Any) -> None:
        self.requests.append(request)
        if "/recording/events" in request.url:
            self.events_log.append(("start", request.url))

    def _ended(self, request: Any) -> None:
        if "/recording/events" in request.url:
            self.events_log.append(("end", request.url))

    def events_requests(self) -> list[str]:
        return [url for kind, url in self.events_log if kind == "start"]


def _sent_url(request: Any) -> str:
    """What goes over the wire: the fragment never does."""
    return str(request.url).split("#", 1)[0]


def _viewer(gw: RunningGateway, session_id: str, key: str) -> str:
    return f"{gw.url}/v1/sessions/{session_id}/viewer#token={key}"


def test_the_viewer_steps_through_a_recorded_session(gw: RunningGateway, recorded: Recorded, browser: Any) -> None:
    watched = Watched(browser)
    page = watched.page
    response = page.goto(_viewer(gw, recorded.session_id, KEY_A))
    assert response is not None and response.ok
    csp = response.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'nonce-" in csp and "unsafe-inline" not in csp
    assert "img-src 'self' blob:" in csp and "frame-ancestors 'none'" in csp
    assert response.headers["referrer-policy"] == "no-referrer"
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["cache-control"] == "no-store"

    page.wait_for_function("() => document.querySelectorAll('#actions li').length === 3")
    items = page.locator("#actions li").all_inner_texts()
    assert items[0].startswith("1. navigate") and items[1].startswith("2. click x=300 y=300")
    page.wait_for_function("() => document.getElementById('frame').naturalWidth === 640")
    assert page.get_attribute("#frame", "src", timeout=1000).startswith("blob:")  # type: ignore[union-attr]
    assert page.inner_text("#position") == "step 1 of 3"
    assert '"title": "first"' in page.inner_text("#details")
    # Scrub to the last step with the timeline; it shows the refused request it caused.
    page.locator("#timeline").fill("3")
    page.wait_for_function("() => document.getElementById('position').textContent === 'step 3 of 3'")
    assert recorded.blocked_action in page.inner_text("#details")
    page.wait_for_selector("#network tr.deny")
    network = page.inner_text("#network")
    assert "blocked.test" in network and "default-deny" in network
    page.keyboard.press("ArrowLeft")
    page.wait_for_function("() => document.getElementById('position').textContent === 'step 2 of 3'")
    assert page.locator("#actions li.current").inner_text().startswith("2. click")
    page.wait_for_function(
        "() => document.getElementById('frame').dataset.frame === '000002.webp'"
        " && document.getElementById('frame').naturalWidth === 640"
    )
    page.wait_for_function("() => document.getElementById('status').textContent === 'ended'")

    # The credential is in no URL the page asked for, and went as a header on every API request.
    asked = [r for r in watched.requests if "/v1/sessions/" in r.url]
    assert any("/recording/frames/" in r.url for r in asked) and any("/traffic?" in r.url for r in asked)
    for request in watched.requests:
        assert KEY_A not in _sent_url(request), request.url
        assert not request.all_headers().get("referer"), request.url  # no-referrer
    for request in asked:
        if "/viewer" not in request.url:
            assert request.all_headers().get("authorization") == f"Bearer {KEY_A}", request.url
    # The page works under its CSP: nothing refused, nothing thrown.
    assert not [line for line in watched.console if "Content Security Policy" in line or "pageerror" in line]
    # (The browser's own /favicon.ico is a 404 the page did not ask for.)
    errors = [line for line in watched.console if line.startswith("error") and not line.endswith("/favicon.ico")]
    assert not errors, (watched.console, watched.failed)
    assert not watched.failed
    page.close()


def test_the_csp_refuses_what_the_page_does_not_bring(gw: RunningGateway, recorded: Recorded, browser: Any) -> None:
    """The console listener above would see a violation: an injected inline script is refused."""
    watched = Watched(browser)
    watched.page.goto(_viewer(gw, recorded.session_id, KEY_A))
    watched.page.wait_for_function("() => document.querySelectorAll('#actions li').length === 3")
    watched.page.evaluate(
        "() => { const s = document.createElement('script'); s.textContent = 'document.title = \"injected\"';"
        " document.body.appendChild(s); }"
    )
    deadline = time.monotonic() + 5
    while not any("Content Security Policy" in line for line in watched.console) and time.monotonic() < deadline:
        watched.page.wait_for_timeout(50)
    assert any("Content Security Policy" in line for line in watched.console), watched.console
    assert watched.page.title() != "injected"
    watched.page.close()


def test_another_key_is_refused_and_old_links_still_open(gw: RunningGateway, recorded: Recorded, browser: Any) -> None:
    other = browser.new_page()
    other.goto(_viewer(gw, recorded.session_id, KEY_B))
    other.wait_for_function("() => document.getElementById('heading').textContent.includes('forbidden')")
    other.close()
    # An old ?token= link is checked, then sent on to the fragment form: the key leaves the address bar.
    old = Watched(browser)
    response = old.page.goto(f"{gw.url}/v1/sessions/{recorded.session_id}/viewer?token={KEY_A}")
    assert response is not None and response.ok
    assert urllib.parse.urlsplit(old.page.url).query == ""
    assert old.page.url.endswith(f"/viewer#token={KEY_A}")
    old.page.wait_for_function("() => document.querySelectorAll('#actions li').length === 3")
    assert all(KEY_A not in _sent_url(r) for r in old.requests[1:])  # after the old link itself
    old.page.close()
    with gw.client(None) as c:
        refused = c.get(f"/v1/sessions/{recorded.session_id}/viewer", params={"token": KEY_B})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"


def test_events_after_a_seq(gw: RunningGateway, recorded: Recorded) -> None:
    path = f"/v1/sessions/{recorded.session_id}/recording/events"
    with gw.client() as c:
        everything = c.get(path).json()
        assert everything["ended"] is True
        seqs = [e["seq"] for e in everything["events"]]
        assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) >= 3
        newer = c.get(path, params={"after": seqs[-2]}).json()
        assert [e["seq"] for e in newer["events"]] == [seqs[-1]] and newer["ended"] is True
        assert c.get(path, params={"after": seqs[-1]}).json() == {"events": [], "ended": True}
        assert c.get(path, params={"after": 0}).json() == everything
        for bad in ["-1", "abc", "1.5", "+1", " 1", "1_0", "", "9" * 40]:
            response = c.get(path, params={"after": bad})
            assert response.status_code == 400, bad
            assert response.json() == {
                "ok": False,  # the one error body, the controller's shape (corral.errors.error_body)
                "error": {
                    "code": "invalid_request",
                    "message": "after must be a non-negative integer (an event's seq)",
                    "field": "after",
                },
            }
        # The credential is checked before the query: another key learns nothing from a bad one.
        assert c.get(path, params={"after": "x"}, headers={"Authorization": f"Bearer {KEY_B}"}).status_code == 403


def test_the_viewer_follows_a_live_session_and_stops_when_it_ends(gw: RunningGateway, browser: Any) -> None:
    watched = Watched(browser)
    page = watched.page
    with Sandbox.create(url=gw.url, api_key=KEY_A) as sb:
        page.goto(_viewer(gw, sb.id, KEY_A))
        page.wait_for_function("() => document.getElementById('status').textContent === 'live'")
        sb.act({"type": "navigate", "url": html_url("<p>live</p>")}, screenshot=True, wait_for="stable")
        page.wait_for_function("() => document.querySelectorAll('#actions li').length === 1", timeout=15_000)
        time.sleep(0.1)
        sb.act({"type": "click", "x": 10, "y": 300}, screenshot=True, wait_for="stable")
        page.wait_for_function("() => document.querySelectorAll('#actions li').length === 2", timeout=15_000)
    # The session is deleted: its recording closes and the page says so, then asks no more.
    page.wait_for_function("() => document.getElementById('status').textContent === 'ended'", timeout=20_000)
    page.wait_for_timeout(200)  # the last response's "requestfinished"
    asked = len(watched.events_requests())
    page.wait_for_timeout(2 * POLL_MS + 1000)
    assert len(watched.events_requests()) == asked
    assert page.inner_text("#position") == "step 1 of 2"
    # Each request asked only for what came after the last event it had, and waited for the one before.
    afters = [int(urllib.parse.parse_qs(urllib.parse.urlsplit(u).query)["after"][0]) for u in watched.events_requests()]
    assert afters == sorted(afters) and afters[0] == 0 and afters[-1] >= 1
    kinds = [kind for kind, _ in watched.events_log]
    assert kinds == ["start", "end"] * (len(kinds) // 2), kinds
    assert not [line for line in watched.console if "Content Security Policy" in line or "pageerror" in line]
    page.close()


HOSTILE = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">&amp;'


def _plant(directory: Path, events: list[dict[str, Any]], *, action_ids: bool) -> str:
    """An ended recording of ``events`` (redacted as the recorder does) in ``directory``, the
    session's under the gateway's recordings, owned by KEY_A; returns its session id. HTTP transfers
    name no action (``action_ids`` false), as the controller records them."""
    from corral.gateway.auth import key_id, load_key_id_key
    from corral.recording.redact import redact

    lines = [
        {
            "seq": n,
            "time": 1.0,
            "event": "action",
            "action_id": f"a{n}.test" if action_ids else None,
            "started": 1.0,
            "frame": None,
            **redact(e),
        }
        for n, e in enumerate(events, start=1)
    ]
    (directory / "events.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    manifest = {
        "format": "corral-recording",
        "version": 1,
        "session": directory.name,
        "created_at": 1.0,
        "ended_at": 2.0,
        "viewport": {"width": 1280, "height": 800},
    }
    (directory / "manifest.json").write_text(json.dumps(manifest))
    (directory / ".owner").write_text(key_id(KEY_A, load_key_id_key(directory.parents[1])))
    assert len(read_bundle(directory).actions) == len(events)  # the strict reader takes it
    return directory.name


def _plant_command_recording(gw: RunningGateway) -> str:
    """An ended recording of an exec whose output is hostile markup, and a file_write, as the
    recorder writes them (redacted); the viewer reads it like any other."""
    session_id = f"ses_cmdview{os.getpid()}"
    directory = Path(gw.settings.data_dir) / "recordings" / session_id
    (directory / "frames").mkdir(parents=True)
    run = {"type": "exec", "command": "cat evil.html; exit 3", "cwd": "/workspace/site"}
    result = {
        "pid": 321,
        "exit_code": 3,
        "signal": None,
        "stdout": HOSTILE + "x" * 70_000,
        "stderr": HOSTILE,
        "stdout_truncated": True,
        "stderr_truncated": False,
        "timed_out": False,
        "duration_ms": 41.5,
        "encoding": "utf-8",
    }
    write = {"type": "file_write", "path": "/workspace/notes.txt", "content": "hello\n"}
    sha = "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
    events = [
        {"request": {"id": 1, "action": run}, "native": [run], "ok": True, "reply": {"ok": True, "result": result}},
        {
            "request": {"id": 2, "action": write},
            "native": [write],
            "ok": True,
            "reply": {"ok": True, "result": {"path": "/workspace/notes.txt", "size": 6, "sha256": sha}},
        },
    ]
    return _plant(directory, events, action_ids=True)


def test_commands_show_their_output_as_text_and_files_their_digest(gw: RunningGateway, browser: Any) -> None:
    session_id = _plant_command_recording(gw)
    watched = Watched(browser)
    page = watched.page
    page.goto(_viewer(gw, session_id, KEY_A))
    page.wait_for_function("() => document.getElementById('status').textContent === 'ended'")
    items = page.locator("#actions li").all_inner_texts()
    assert items == ["1. exec cat evil.html; exit 3 \u2192 exit 3", "2. file_write /workspace/notes.txt (6 bytes)"]
    page.wait_for_selector("#result pre.stdout")
    facts = page.inner_text("#result table")
    for shown in ("cat evil.html; exit 3", "/workspace/site", "321", "41.5 ms"):
        assert shown in facts
    assert "exit code\t3" in facts
    # The output is there as the text it was, cut as recorded, and nothing in it ran or became markup.
    assert page.inner_text("#result pre.stdout").startswith(HOSTILE)
    assert page.inner_text("#result pre.stderr") == HOSTILE
    notes = page.locator("#result p.note").all_inner_texts()
    assert notes[0].startswith("recorded: the first ") and f"of {len(HOSTILE) + 70_000} bytes" in notes[0]
    assert "cut at max_output_bytes" in notes[0] and "sha256 " in notes[0]
    assert page.evaluate("() => window.pwned === undefined")
    assert (
        page.evaluate("() => document.querySelectorAll('#result script, #result img, main img:not(#frame)').length")
        == 0
    )
    page.locator("#actions li").nth(1).click()
    page.wait_for_function("() => document.querySelector('#result h2')?.textContent === 'File'")
    facts = page.inner_text("#result table")
    assert "/workspace/notes.txt" in facts and "6 bytes" in facts
    assert "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03" in facts
    assert not [line for line in watched.console if "Content Security Policy" in line or "pageerror" in line]
    assert page.evaluate("() => window.pwned === undefined")
    page.close()


def _plant_transfer_recording(gw: RunningGateway) -> str:
    """An ended recording of an exec with an env secret and files moved over HTTP, as the controller
    records them (corral.sandbox.tools.transfer_record) and redacts them."""
    session_id = f"ses_xferview{os.getpid()}"
    directory = Path(gw.settings.data_dir) / "recordings" / session_id
    (directory / "frames").mkdir(parents=True)
    run = {"type": "exec", "command": "deploy", "env": {"API_TOKEN": "tok-never-shown", "MODE": "fast"}}
    done = {"exit_code": 0, "signal": None, "stdout": "", "stderr": "", "duration_ms": 3.0, "encoding": "utf-8"}
    up = {"direction": "upload", "path": "/workspace/in.bin", "size": 4096, "sha256": "a" * 64}
    down = {"direction": "download", "path": "/workspace/out", "type": "directory", "size": 10240}
    events = [
        {"request": {"id": 1, "action": run}, "native": [run], "ok": True, "reply": {"ok": True, "result": done}},
        {
            "dialect": "http",
            "request": {"http": "PUT /v1/files", "query": {"path": "in.bin"}},
            "native": [{"type": "file_upload", "path": "in.bin"}],
            "ok": True,
            "reply": {"ok": True, "result": up},
        },
        {
            "dialect": "http",
            "request": {"http": "GET /v1/files", "query": {"path": "out"}},
            "native": [{"type": "file_download", "path": "out"}],
            "ok": True,
            "reply": {"ok": True, "result": {**down, "sha256": "b" * 64, "complete": False, "cut": "the client left"}},
        },
    ]
    return _plant(directory, events, action_ids=False)


def test_files_moved_over_http_show_as_file_steps_and_env_by_name_only(gw: RunningGateway, browser: Any) -> None:
    session_id = _plant_transfer_recording(gw)
    watched = Watched(browser)
    page = watched.page
    page.goto(_viewer(gw, session_id, KEY_A))
    page.wait_for_function("() => document.getElementById('status').textContent === 'ended'")
    items = page.locator("#actions li").all_inner_texts()
    assert items[1:] == ["2. file_upload in.bin (4096 bytes)", "3. file_download out (10240 bytes)"]
    page.wait_for_selector("#result table")
    facts = page.inner_text("#result table")
    assert "API_TOKEN MODE" in facts and "tok-never-shown" not in page.content()
    page.locator("#actions li").nth(1).click()
    page.wait_for_function("() => document.querySelector('#result h2')?.textContent === 'File'")
    facts = page.inner_text("#result table")
    assert "upload over HTTP" in facts and "/workspace/in.bin" in facts and "a" * 64 in facts
    page.locator("#actions li").nth(2).click()
    page.wait_for_function("() => document.querySelector('#result td')?.textContent === '/workspace/out'")
    facts = page.inner_text("#result table")
    assert "download over HTTP" in facts and "a tar of the directory" in facts and "b" * 64 in facts
    assert "no: the client left" in facts
    assert not [line for line in watched.console if "Content Security Policy" in line or "pageerror" in line]
    page.close()


def test_secret_records_show_the_secret_by_name_where_and_how_often(browser: Any) -> None:
    """The page against hand-written records in the audit log's shapes (no gateway: every fetch is routed)."""
    from corral.gateway.viewer import viewer_page

    origin, session = "http://viewer.test", "ses_secrets1"
    action = {"seq": 1, "time": 1.0, "event": "action", "ok": True, "action_id": "a1.b", "native": [{"type": "click"}]}
    traffic = [
        {"seq": 5, "event": "request", "decision": "allow", "method": "POST", "host": "api.example.test",
         "url": "https://api.example.test/v1/x", "status": 200, "rule": "api.example.test", "action": "a1.b"},
        {"seq": 6, "event": "secret", "method": "POST", "host": "api.example.test", "url": "https://api.example.test/v1/x",
         "rule": "secret-substitution", "secret": "GITHUB_TOKEN", "location": "header", "count": 2, "action": "a1.b"},
        {"seq": 7, "event": "block", "decision": "deny", "method": "POST", "host": "evil.test", "url": "https://evil.test/",
         "status": 403, "rule": "secret-misuse", "secret": "GITHUB_TOKEN", "location": "body", "exfiltration": True,
         "action": "a1.b"},
    ]  # fmt: skip
    page_body = viewer_page(session)

    def answer(route: Any) -> None:
        url = route.request.url
        if url.endswith("/viewer"):
            route.fulfill(status=200, body=page_body.body, headers=page_body.headers, content_type="text/html")
        elif "/recording/events" in url:
            events = [action] if "after=0" in url else []
            route.fulfill(status=200, json={"events": events, "ended": True})
        elif "/traffic?action=a1.b" in url:
            route.fulfill(status=200, body="".join(json.dumps(r) + "\n" for r in traffic))
        else:
            route.fulfill(status=404, json={"error": {"code": "not_found", "message": url}})

    page = browser.new_page()
    try:
        page.route(f"{origin}/**", answer)
        page.goto(f"{origin}/v1/sessions/{session}/viewer#token=key-1")
        page.wait_for_selector("#network tr.secret")
        rows = page.locator("#network tr").all_inner_texts()
        assert len(rows) == 3
        assert "secret-substitution (GITHUB_TOKEN in header x2)" in rows[1]
        assert "secret" in rows[1] and "undefined" not in rows[1]  # a secret record has no decision or status
        assert "secret-misuse (GITHUB_TOKEN in body, exfiltration)" in rows[2]
        assert page.locator("#network tr.deny").count() == 1
    finally:
        page.close()
