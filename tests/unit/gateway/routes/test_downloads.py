"""The downloads routes' pure parts (corral.gateway.routes.downloads): the controller's list read
bounded and validated whole, its refusals by code, a MIME type fit for a header. The routes
themselves run against the real images (tests/integration/test_downloads.py)."""

from __future__ import annotations

import json

import pytest

from corral.errors import DownloadNotFound, DownloadUnavailable, SandboxError
from corral.gateway.routes.downloads import MAX_LIST_BYTES, _media, listing_of, refusal

RECORD = {
    "id": "c341624d-6c3a-4174-aff6-77bed4879276",
    "name": "r.pdf",
    "path": "/home/agent/Downloads/r.pdf",
    "url": "https://x.test/r.pdf",
    "mime_type": "application/pdf",
    "state": "completed",
    "size": 3,
    "total_bytes": 3,
    "started_at": 1.0,
    "finished_at": 2.0,
    "cause": {"kind": "action", "action_id": "a1.beef", "action": "navigate"},
}


def _list(*records: dict[str, object]) -> bytes:
    body = {"ok": True, "downloads": list(records), "total_bytes": 3, "max_file_bytes": 9, "max_session_bytes": 99}
    return json.dumps(body).encode()


def test_a_good_list_reads_whole() -> None:
    listing = listing_of(_list(RECORD))
    assert listing.downloads[0].name == "r.pdf" and listing.downloads[0].cause.action_id == "a1.beef"


@pytest.mark.parametrize(
    "bad",
    [
        {"state": "exploded"},
        {"name": ""},
        {"name": "n" * 201},
        {"size": -1},
        {"id": "../../etc"},
        {"cause": {"kind": "gremlin"}},
        {"extra": "field"},
    ],
)
def test_a_sandbox_s_list_out_of_its_bounds_is_the_sandbox_s_fault(bad: dict[str, object]) -> None:
    with pytest.raises(SandboxError):
        listing_of(_list({**RECORD, **bad}))


def test_a_list_too_big_or_no_object_is_refused_unread() -> None:
    with pytest.raises(SandboxError, match="over"):
        listing_of(b" " * (MAX_LIST_BYTES + 1))
    for body in (b"[]", b"not json", b"1"):
        with pytest.raises(SandboxError):
            listing_of(body)


def test_the_controller_s_refusals_by_code() -> None:
    def body(code: str) -> bytes:
        return json.dumps({"ok": False, "error": {"code": code, "message": "m", "field": "download_id"}}).encode()

    assert isinstance(refusal(404, body("no_such_download")), DownloadNotFound)
    assert isinstance(refusal(409, body("download_unavailable")), DownloadUnavailable)
    assert isinstance(refusal(500, body("internal")), SandboxError)
    assert isinstance(refusal(502, b"<html>"), SandboxError)


@pytest.mark.parametrize(
    ("given", "sent"),
    [
        ("application/pdf", "application/pdf"),
        ("text/html", "text/html"),
        ("text/html\r\nX-Injected: 1", "application/octet-stream"),
        ("nonsense", "application/octet-stream"),
        ("a/b;charset=x", "application/octet-stream"),
    ],
)
def test_a_mime_type_goes_in_the_header_only_as_a_type(given: str, sent: str) -> None:
    assert _media(given) == sent
