"""The download tools at the SDK's seam: what each sends the gateway and what the model reads back
(the list, a download's text or base64), and a download too big for a tool as a tool error."""

from __future__ import annotations

import base64

import httpx

from .conftest import FakeGateway, call, connect

S = "ses_0123456789abcdef"
GUID = "c341624d-6c3a-4174-aff6-77bed4879276"
ROW = {
    "id": GUID,
    "name": "a.bin",
    "path": "/home/agent/Downloads/a.bin",
    "url": "https://x.test/a.bin",
    "mime_type": "application/octet-stream",
    "state": "completed",
    "size": 3,
    "total_bytes": 3,
    "started_at": 1.0,
    "finished_at": 2.0,
    "cause": {"kind": "browser", "action_id": None, "action": None, "actor": None},
    "error": None,
}


def _answer(size: int, content: bytes) -> object:
    listed = {"downloads": [ROW | {"size": size}], "total_bytes": size, "max_file_bytes": 9, "max_session_bytes": 99}

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith(f"/downloads/{GUID}"):
            return httpx.Response(200, content=content)
        return httpx.Response(200, json=listed)

    return answer


async def test_list_and_read_a_download(fake: FakeGateway) -> None:
    fake.answer = _answer(3, b"\xff\x00\x01")  # type: ignore[assignment]
    async with connect(fake) as client:
        listed = await call(client, "list_downloads", session_id=S)
        read = await call(client, "read_download", session_id=S, download_id=GUID)
    assert not listed.is_error and listed.structured_content is not None
    assert listed.structured_content["downloads"][0]["id"] == GUID
    assert read.structured_content == {
        "id": GUID,
        "content": base64.b64encode(b"\xff\x00\x01").decode(),
        "encoding": "base64",
        "size": 3,
    }
    assert [(r.method, r.url.path) for r in fake.sent] == [
        ("GET", f"/v1/sessions/{S}/downloads"),
        ("GET", f"/v1/sessions/{S}/downloads"),
        ("GET", f"/v1/sessions/{S}/downloads/{GUID}"),
    ]


async def test_a_download_too_big_for_a_tool_is_a_tool_error_and_never_read(fake: FakeGateway) -> None:
    fake.answer = _answer(5 << 20, b"")  # type: ignore[assignment]
    async with connect(fake) as client:
        result = await call(client, "read_download", session_id=S, download_id=GUID)
    assert result.is_error and result.structured_content is not None
    assert result.structured_content["error"]["code"] == "too_large"
    assert [r.url.path for r in fake.sent] == [f"/v1/sessions/{S}/downloads"]


async def test_a_download_bigger_than_its_listed_size_is_cut_at_the_tools_bound(fake: FakeGateway) -> None:
    # The sandbox's list is its word: a row listed at 3 bytes whose fetch brings more than a tool may
    # hold is refused once the bound passes, not read whole into the server's memory.
    from corral.mcp.downloads import MAX_TOOL_BYTES

    fake.answer = _answer(3, b"x" * (MAX_TOOL_BYTES + 1))  # type: ignore[assignment]
    async with connect(fake) as client:
        result = await call(client, "read_download", session_id=S, download_id=GUID)
    assert result.is_error and result.structured_content is not None
    assert result.structured_content["error"]["code"] == "too_large"
