"""The viewer's page and headers, and the incremental events read it polls (no Docker needed)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from corral.gateway.recording import RecordingManager
from corral.gateway.viewer import viewer_page
from corral.recording.bundle import EVENTS_FILE, MANIFEST_FILE

from .controller_fake import SECRET, proving

SESSION = "ses_abc123"


def _bundle(root: Path, lines: list[bytes], manifest: dict[str, object] | None = None) -> RecordingManager:
    directory = root / SESSION
    directory.mkdir(parents=True)
    (directory / MANIFEST_FILE).write_text(json.dumps(manifest if manifest is not None else {"format": "x"}))
    (directory / EVENTS_FILE).write_bytes(b"".join(lines))
    return RecordingManager(root)


def _line(seq: int, **fields: object) -> bytes:
    # As the recorder writes them: seq first, compact.
    return json.dumps({"seq": seq, "time": 1.0, "event": "action", **fields}, separators=(",", ":")).encode() + b"\n"


def test_events_after_a_seq(tmp_path: Path) -> None:
    recordings = _bundle(tmp_path, [_line(1), _line(2), _line(3)])
    assert [e["seq"] for e in recordings.events(SESSION)["events"]] == [1, 2, 3]
    assert [e["seq"] for e in recordings.events(SESSION, after=1)["events"]] == [2, 3]
    assert recordings.events(SESSION, after=3) == {"events": [], "ended": False}
    assert recordings.events(SESSION, after=99) == {"events": [], "ended": False}


def test_lines_in_another_layout_and_torn_lines(tmp_path: Path) -> None:
    other_layout = json.dumps({"time": 1.0, "seq": 2, "event": "gap", "lost": 1}).encode() + b"\n"
    recordings = _bundle(tmp_path, [_line(1), other_layout, b"\n", _line(3), b'{"seq":4,"time":1.0,"ev'])
    assert [e["seq"] for e in recordings.events(SESSION, after=1)["events"]] == [2, 3]  # the torn last one left out
    assert [e["seq"] for e in recordings.events(SESSION, after=2)["events"]] == [3]


def test_ended_once_the_manifest_says_so(tmp_path: Path) -> None:
    recordings = _bundle(tmp_path, [_line(1)], {"format": "x", "ended_at": 1700000000.0, "end_reason": "deleted"})
    assert recordings.events(SESSION, after=1) == {"events": [], "ended": True}


@pytest.mark.parametrize("manifest", [b"", b"not json", b"[1, 2]"])
def test_an_unreadable_manifest_is_not_ended(tmp_path: Path, manifest: bytes) -> None:
    recordings = _bundle(tmp_path, [_line(1)])
    (tmp_path / SESSION / MANIFEST_FILE).write_bytes(manifest)
    assert recordings.events(SESSION)["ended"] is False


def test_no_bundle_yet(tmp_path: Path) -> None:
    assert RecordingManager(tmp_path).events(SESSION) == {"events": [], "ended": False}


def test_the_page_and_its_policy_share_a_fresh_nonce() -> None:
    first, second = viewer_page(SESSION), viewer_page(SESSION)
    csp = first.headers["content-security-policy"]
    nonce = re.search(r"script-src 'nonce-([^']+)'", csp)
    assert nonce is not None and f"style-src 'nonce-{nonce[1]}'" in csp
    assert first.body.count(f'nonce="{nonce[1]}"') == 2  # the one <style> and the one <script>
    assert first.body.count("<script") == 1 and first.body.count("<style") == 1
    assert nonce[1] not in second.headers["content-security-policy"]
    assert "unsafe" not in csp and "default-src 'none'" in csp
    for directive in (
        "img-src 'self' blob:",
        "connect-src 'self'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
        "form-action 'none'",
    ):
        assert directive in csp
    assert first.headers["referrer-policy"] == "no-referrer"
    assert first.headers["cache-control"] == "no-store"
    assert first.headers["x-content-type-options"] == "nosniff"


def test_the_page_puts_no_credential_in_a_url() -> None:
    body = viewer_page(SESSION).body
    assert "location.search" not in body and "?token=" not in body.replace("#token=", "")
    assert "location.hash" in body and '"Bearer " + token' in body
    assert "setInterval" not in body  # polled by a timeout after each answer, never stacked


async def test_a_live_recording_skips_the_lines_already_read(tmp_path: Path) -> None:
    recordings = _bundle(tmp_path, [_line(1), _line(2), _line(3)])
    # A controller that does not record: the recorder carries on with the bundle and only waits.
    client = httpx.AsyncClient(transport=httpx.MockTransport(proving(lambda _: httpx.Response(404))))
    recordings.start(SESSION, "http://sandbox.invalid", None, client, {}, "key", secret=SECRET)
    try:
        # The first line rewritten in place, as another event: the recorder knows where line 2 starts,
        # so a reader after seq 1 never reads it.
        events = tmp_path / SESSION / EVENTS_FILE
        events.write_bytes(_line(9) + events.read_bytes()[len(_line(1)) :])
        assert [e["seq"] for e in recordings.events(SESSION, after=1)["events"]] == [2, 3]
        assert [e["seq"] for e in recordings.events(SESSION, after=0)["events"]] == [9, 2, 3]
        assert recordings.events(SESSION, after=3)["events"] == []
    finally:
        await recordings.stop_all()
        await client.aclose()


def test_the_page_never_makes_markup_of_what_it_shows_and_reads_the_payloads_recorded() -> None:
    from corral.recording.redact import redact

    page = viewer_page(SESSION).body
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in page  # a command's output is the sandbox's text: textContent only
    recorded = [
        ({"type": "exec", "command": "x", "stdin": "in"}, {"stdout": "o", "stderr": "e"}),
        ({"type": "file_write", "path": "p", "content": "c"}, {}),
        ({"type": "file_write", "path": "p", "content_base64": "YQ=="}, {}),
        ({"type": "file_read", "path": "p"}, {"content": "c"}),
        ({"type": "process_output", "pid": 1}, {"data": "d"}),
    ]
    paths: set[str] = set()
    for act, result in recorded:
        paths |= set(redact({"request": {"action": act}, "native": [act], "reply": {"result": result}})["payloads"])
    # Every payload path the page looks up is one the recorder writes.
    read = set(re.findall(r'"((?:reply\.result|request\.action)\.\w+)"', page))
    assert {"reply.result.stdout", "reply.result.stderr", "reply.result.content", "request.action.content"} <= read
    assert read <= paths


def test_the_page_is_package_data_with_every_placeholder_filled() -> None:
    from importlib import resources

    page = viewer_page(SESSION).body
    assert resources.files("corral.gateway").joinpath("viewer.html").is_file()
    assert not re.search(r"__[A-Z_]+__", page)  # no placeholder left unfilled
    assert '"ses_abc123"' in page and "POLL_MS = 2000" in page and "RETRY_MS = 2000" in page
    # Under the CSP no inline handler would run: the page has none (listeners are added by its script).
    assert not re.search(r"<[^>]+\son[a-z]+\s*=", page)
    # The credential is read from the fragment only: #link= first, then #token=.
    assert 'fragment.get("link") || fragment.get("token")' in page
    assert "location.search" not in page
