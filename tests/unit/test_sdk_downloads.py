"""``sb.downloads``: the requests both twins send through the gateway clients (over httpx's mock
transport, the one seam), how the answers are read, which download ``wait`` picks."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from corral.errors import DownloadNotFound, DownloadWaitTimedOut, ErrorCode, GatewayError, InvalidRequest, error_body
from corral.gateway_client import AsyncGateway, Gateway
from corral.protocol.downloads import Download
from corral.sdk import AsyncSandbox, Sandbox
from corral.sdk.downloads import matches

SESSION = "ses_0123456789abcdef"
GUID = "c341624d-6c3a-4174-aff6-77bed4879276"
RECORD = {
    "id": GUID,
    "name": "report (1).pdf",
    "path": "/home/agent/Downloads/report (1).pdf",
    "url": "https://x.test/report.pdf",
    "mime_type": "application/pdf",
    "state": "completed",
    "size": 5,
    "total_bytes": 5,
    "started_at": 100.0,
    "finished_at": 101.0,
    "cause": {"kind": "cdp", "actor": "cdp:c1"},
}
LISTED = {"downloads": [RECORD], "total_bytes": 5, "max_file_bytes": 9, "max_session_bytes": 99}


def _answer(request: httpx.Request) -> httpx.Response:
    if request.url.path.endswith(f"/downloads/{GUID}"):
        return httpx.Response(200, content=b"%PDF!", headers={"content-type": "application/pdf"})
    if "/downloads/" in request.url.path:
        return httpx.Response(404, json=error_body("no_such_download", "no download", "download_id"))
    return httpx.Response(200, json=LISTED)


def _twins(seen: list[httpx.Request]) -> tuple[Sandbox, AsyncSandbox]:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return _answer(request)

    sandbox, twin = Sandbox.__new__(Sandbox), AsyncSandbox.__new__(AsyncSandbox)
    sandbox.id = twin.id = SESSION
    sandbox._gateway = Gateway("http://gateway.test", "tok", transport=httpx.MockTransport(answer))
    twin._gateway = AsyncGateway("http://gateway.test", "tok", transport=httpx.MockTransport(answer))
    return sandbox, twin


async def test_both_twins_list_read_save_and_wait_with_the_same_requests(tmp_path: Path) -> None:
    seen: list[httpx.Request] = []
    sandbox, twin = _twins(seen)
    listed = sandbox.downloads.list()
    assert listed == await twin.downloads.list()
    assert [type(row) for row in listed] == [Download] and listed[0].cause.actor == "cdp:c1"
    assert sandbox.downloads.read(GUID) == await twin.downloads.read(GUID) == b"%PDF!"
    saved = sandbox.downloads.save(GUID, tmp_path / "a.pdf")
    twin_saved = await twin.downloads.save(GUID, tmp_path / "b.pdf")
    assert saved.path.read_bytes() == twin_saved.path.read_bytes() == b"%PDF!" and saved.size == 5
    assert sandbox.downloads.wait(url="https://x.test/report.pdf", timeout_s=0).id == GUID
    assert (await twin.downloads.wait(name="report.pdf", timeout_s=0)).id == GUID
    paths = [(r.method, r.url.path) for r in seen]
    assert paths[:2] == [("GET", f"/v1/sessions/{SESSION}/downloads")] * 2
    assert paths[2:6] == [("GET", f"/v1/sessions/{SESSION}/downloads/{GUID}")] * 4
    assert all(r.headers["authorization"] == "Bearer tok" for r in seen)


async def test_an_unknown_id_is_the_gateways_structured_404_and_get_says_so_too() -> None:
    sandbox, twin = _twins([])
    with pytest.raises(GatewayError) as caught:
        sandbox.downloads.read("nope")
    assert caught.value.status == 404 and caught.value.code == "no_such_download"
    with pytest.raises(DownloadNotFound):
        await twin.downloads.get("nope")


async def test_a_wait_without_a_filter_is_refused_and_one_that_finds_nothing_times_out() -> None:
    sandbox, twin = _twins([])
    with pytest.raises(InvalidRequest):
        sandbox.downloads.wait()
    with pytest.raises(DownloadWaitTimedOut) as caught:
        await twin.downloads.wait(url="https://other.test/", timeout_s=0)
    assert caught.value.code == ErrorCode.TIMEOUT


@pytest.mark.parametrize(
    ("url", "name", "since", "found"),
    [
        ("https://x.test/report.pdf", None, None, True),
        ("https://x.test/other.pdf", None, None, False),
        (None, "report (1).pdf", None, True),
        (None, "report.pdf", None, True),  # Chromium made the name unique
        (None, "report.txt", None, False),
        (None, "port.pdf", None, False),
        (None, None, 100.0, True),
        (None, None, 100.5, False),
    ],
)
def test_which_download_matches(url: str | None, name: str | None, since: float | None, found: bool) -> None:
    assert matches(Download.model_validate(RECORD), url, name, since) is found
