"""A session's files over HTTP, against a fake controller at the gateway's HTTP client: uploads passed on
chunk by chunk and capped (nothing kept past the cap), downloads streamed with their headers, the
controller's refusals answered from the one table."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from corral.contracts import auth
from corral.errors import ErrorCode, InvalidRequest, StreamAborted, error_body
from corral.gateway import auth as gateway_auth
from corral.gateway.models import CreateSession
from corral.gateway.routes.files import controller_params, refusal
from corral.gateway.sessions import Session, SessionManager

from .conftest import KEY, KEY_ID_SECRET, OTHER_KEY, Client, settings_for, wired

SECRET = auth.new_secret()
CHUNK = 64 << 10
AsyncHandler = Callable[[httpx.Request], Awaitable[httpx.Response]]


class FakeController:
    """The controller's ``/v1/files`` as the design has it: an upload goes to a temporary file that is
    renamed only once the whole body came; a download streams the file in chunks."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[httpx.Request] = []
        self.chunks: list[int] = []  # the sizes of the upload's pieces as they came
        self.refuse: tuple[int, dict[str, object]] | None = None
        self.download_closed = False
        self.sized = True  # says the download's content-length (a lying sandbox would not)
        self.declared: int | None = None  # a content-length of its own choosing

    def _local(self, request: httpx.Request) -> Path:
        return self.root / request.url.params["path"].lstrip("/")

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.refuse is not None:
            return httpx.Response(self.refuse[0], json=self.refuse[1])
        return await (self._put(request) if request.method == "PUT" else self._get(request))

    async def _put(self, request: httpx.Request) -> httpx.Response:
        target = self._local(request)
        if request.url.params.get("make_dirs") == "1":
            target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(f".{target.name}.part")
        digest, size = hashlib.sha256(), 0
        try:
            with part.open("wb") as out:
                async for chunk in request.stream:  # type: ignore[union-attr]
                    self.chunks.append(len(chunk))
                    out.write(chunk)
                    digest.update(chunk)
                    size += len(chunk)
        except BaseException:
            part.unlink(missing_ok=True)  # a body cut short leaves nothing
            raise
        part.rename(target)
        return httpx.Response(
            200, json={"ok": True, "path": request.url.params["path"], "size": size, "sha256": digest.hexdigest()}
        )

    async def _get(self, request: httpx.Request) -> httpx.Response:
        data = self._local(request).read_bytes()

        async def pieces() -> AsyncIterator[bytes]:
            try:
                for start in range(0, len(data), CHUNK):
                    yield data[start : start + CHUNK]
            finally:
                self.download_closed = True

        headers = {"content-type": "application/octet-stream", "x-internal": "1"}
        if self.sized:
            headers["content-length"] = str(len(data) if self.declared is None else self.declared)
        return httpx.Response(200, headers=headers, content=pieces())


class Streaming(httpx.AsyncBaseTransport):
    """Hands each request to ``handler`` as it is, its body unread (httpx.MockTransport reads it whole
    first, which would hide whether the gateway streams)."""

    def __init__(self, handler: AsyncHandler) -> None:
        self._handler = handler

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._handler(request)


def proving(handler: AsyncHandler) -> AsyncHandler:
    """The controller's door: it checks the gateway's signature and proves the secret on its answer."""
    verifier = auth.RequestVerifier(SECRET)

    async def answer(request: httpx.Request) -> httpx.Response:
        nonce = verifier.verify(request.headers[auth.AUTH_HEADER])
        response = await handler(request)
        response.headers[auth.PROOF_HEADER] = auth.prove(SECRET, nonce)
        return response

    return answer


@pytest.fixture()
async def files_app(tmp_path: Path) -> AsyncIterator[tuple[FastAPI, FakeController]]:
    (tmp_path / "sandbox").mkdir()
    fake = FakeController(tmp_path / "sandbox")
    app = wired(settings_for(tmp_path / "data", max_upload_bytes=1 << 20))
    app.state.http = httpx.AsyncClient(transport=Streaming(proving(fake)))
    yield app, fake
    await app.state.http.aclose()


async def _session(app: FastAPI) -> tuple[Session, str]:
    manager: SessionManager = app.state.manager
    session, token = await manager.create(gateway_auth.key_id(KEY, KEY_ID_SECRET), CreateSession())
    session.sandbox = dataclasses.replace(session.sandbox, secret=SECRET)
    return session, token


def _client(app: FastAPI, credential: str | None) -> httpx.AsyncClient:
    headers = {"authorization": f"Bearer {credential}"} if credential else {}
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw", headers=headers)


async def _pieces(data: bytes, size: int = CHUNK) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


async def test_an_upload_is_passed_on_piece_by_piece_and_answered_with_the_controllers_reply(
    files_app: tuple[FastAPI, FakeController],
) -> None:
    app, fake = files_app
    session, token = await _session(app)
    data = bytes(range(256)) * 2048  # 512 KiB
    async with _client(app, token) as holder:
        reply = await holder.put(
            f"/v1/sessions/{session.id}/files",
            params={"path": "/workspace/a.bin", "make_dirs": "1", "mode": "0600", "other": "x"},
            content=_pieces(data),
        )
    assert reply.status_code == 200, reply.text
    assert reply.json() == {
        "ok": True,
        "path": "/workspace/a.bin",
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    (request,) = fake.requests
    assert (request.method, request.url.path) == ("PUT", "/v1/files")
    assert dict(request.url.params) == {"path": "/workspace/a.bin", "make_dirs": "1", "mode": "0600"}
    assert request.headers["content-type"] == "application/octet-stream"
    assert (fake.root / "workspace" / "a.bin").read_bytes() == data
    # Never gathered whole: the controller got the body in the pieces the client sent.
    assert len(fake.chunks) == len(data) // CHUNK and max(fake.chunks) == CHUNK
    assert session.in_flight == 0


async def test_an_upload_whose_length_is_over_the_cap_is_refused_before_the_sandbox_is_asked(
    files_app: tuple[FastAPI, FakeController],
) -> None:
    app, fake = files_app
    session, token = await _session(app)
    async with _client(app, token) as holder:
        reply = await holder.put(
            f"/v1/sessions/{session.id}/files",
            params={"path": "/workspace/big"},
            content=b"x",
            headers={"content-length": str((1 << 20) + 1)},
        )
    assert reply.status_code == 413 and reply.json()["error"]["code"] == "too_large"
    assert reply.headers["connection"] == "close"
    assert fake.requests == []


async def test_an_upload_that_streams_past_the_cap_is_cut_off_and_leaves_no_file(
    files_app: tuple[FastAPI, FakeController],
) -> None:
    app, fake = files_app
    session, token = await _session(app)
    async with _client(app, token) as holder:  # chunked: no length to refuse it by
        reply = await holder.put(
            f"/v1/sessions/{session.id}/files",
            params={"path": "/big"},
            content=_pieces(b"x" * ((1 << 20) + CHUNK)),
        )
    assert reply.status_code == 413 and reply.json()["error"]["code"] == "too_large"
    # The controller had begun (it got no byte past the cap), and saw its body end short.
    assert len(fake.requests) == 1 and 0 < sum(fake.chunks) <= 1 << 20
    assert list(fake.root.iterdir()) == []  # neither the file nor its temporary one
    assert session.in_flight == 0


async def test_a_client_that_leaves_mid_upload_leaves_no_file_and_no_error(
    files_app: tuple[FastAPI, FakeController],
) -> None:
    app, fake = files_app
    session, token = await _session(app)
    messages = [
        {"type": "http.request", "body": b"x" * CHUNK, "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "PUT",
        "scheme": "http",
        "path": f"/v1/sessions/{session.id}/files",
        "raw_path": f"/v1/sessions/{session.id}/files".encode(),
        "query_string": b"path=/left.bin",
        "headers": [(b"host", b"gw"), (b"authorization", f"Bearer {token}".encode()), (b"content-length", b"999999")],
        "client": ("127.0.0.1", 1),
        "server": ("gw", 80),
    }
    await app(scope, receive, send)  # no exception: the route answers, though no one reads it
    assert sent[0]["status"] == 400
    assert len(fake.requests) == 1 and fake.chunks == [CHUNK]
    assert list(fake.root.iterdir()) == []
    assert session.in_flight == 0


async def test_a_download_streams_the_file_with_its_headers_and_closes_the_upstream(
    files_app: tuple[FastAPI, FakeController],
) -> None:
    app, fake = files_app
    session, token = await _session(app)
    data = b"\x00\xff" * (3 * CHUNK)
    (fake.root / "out.bin").write_bytes(data)
    async with (
        _client(app, token) as holder,
        holder.stream("GET", f"/v1/sessions/{session.id}/files", params={"path": "/out.bin"}) as reply,
    ):
        body = await reply.aread()
    assert reply.status_code == 200 and body == data
    assert reply.headers["content-type"] == "application/octet-stream"
    assert reply.headers["content-length"] == str(len(data))
    assert "x-internal" not in reply.headers and auth.PROOF_HEADER.lower() not in reply.headers
    assert dict(fake.requests[0].url.params) == {"path": "/out.bin", "max_bytes": str(1 << 30)}
    assert reply.headers["x-corral-max-download-bytes"] == str(1 << 30)
    assert fake.download_closed and session.in_flight == 0


async def test_a_download_that_streams_past_the_cap_is_cut_at_the_cap_with_too_large(
    files_app: tuple[FastAPI, FakeController],
) -> None:
    app, fake = files_app
    cap = 2 * CHUNK + 5
    app.state.settings = app.state.settings.model_copy(update={"max_download_bytes": cap})
    session, token = await _session(app)
    (fake.root / "big.bin").write_bytes(b"b" * (3 * CHUNK))
    fake.sized = False  # a sandbox that says nothing of the size (or lies) is counted all the same
    sent: list[dict[str, Any]] = []
    asked: list[bool] = []

    async def receive() -> dict[str, Any]:
        if asked:  # the client stays: the server waits for its disconnect until the answer ends
            await asyncio.Event().wait()
        asked.append(True)
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": f"/v1/sessions/{session.id}/files",
        "raw_path": f"/v1/sessions/{session.id}/files".encode(),
        "query_string": b"path=/big.bin",
        "headers": [(b"host", b"gw"), (b"authorization", f"Bearer {token}".encode())],
        "client": ("127.0.0.1", 1),
        "server": ("gw", 80),
    }
    with pytest.raises(StreamAborted, match=f"passed the cap of {cap} bytes"):  # the server aborts the answer
        await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    assert start["status"] == 200 and (b"x-corral-max-download-bytes", str(cap).encode()) in start["headers"]
    bodies = [m for m in sent if m["type"] == "http.response.body"]
    received = sum(len(m.get("body", b"")) for m in bodies)
    assert all(m.get("more_body") for m in bodies)  # never its clean end: the client sees it cut
    assert received == cap  # never a byte past the cap
    assert fake.requests[0].url.params["max_bytes"] == str(cap)
    assert session.in_flight == 0


async def test_a_download_whose_length_is_over_the_cap_is_413_before_a_byte(
    files_app: tuple[FastAPI, FakeController],
) -> None:
    app, fake = files_app
    app.state.settings = app.state.settings.model_copy(update={"max_download_bytes": 1000})
    session, token = await _session(app)
    (fake.root / "big.bin").write_bytes(b"b" * 2000)
    async with _client(app, token) as holder:
        reply = await holder.get(f"/v1/sessions/{session.id}/files", params={"path": "/big.bin"})
    assert reply.status_code == 413
    assert reply.json() == error_body(
        "too_large", "a download is limited to 1000 bytes (CORRAL_MAX_DOWNLOAD_BYTES)", "path"
    )
    assert session.in_flight == 0


@pytest.mark.parametrize(
    ("status", "code", "expected"),
    [
        (404, "no_such_file", 404),
        (403, "permission_denied", 403),
        (400, "invalid_field", 400),
        (409, "not_a_directory", 409),
        (409, "is_a_directory", 409),
        (507, "no_space", 507),
        (413, "too_large", 413),
        (500, "file_failed", 500),
    ],
)
async def test_the_controllers_refusal_is_answered_from_the_table(
    files_app: tuple[FastAPI, FakeController], status: int, code: str, expected: int
) -> None:
    app, fake = files_app
    session, token = await _session(app)
    fake.refuse = (status, error_body(code, "said the sandbox", "path"))
    async with _client(app, token) as holder:
        down = await holder.get(f"/v1/sessions/{session.id}/files", params={"path": "/x"})
        up = await holder.put(f"/v1/sessions/{session.id}/files", params={"path": "/x"}, content=b"data")
    for reply in (down, up):
        assert reply.status_code == expected
        assert reply.json() == error_body(code, "said the sandbox", "path")
    assert session.in_flight == 0


async def test_control_taken_is_passed_on_whole_with_its_holder_and_the_wait_goes_to_the_controller(
    files_app: tuple[FastAPI, FakeController],
) -> None:
    app, fake = files_app
    session, token = await _session(app)
    taken = {"ok": False, "error": {"code": "control_taken", "message": "held", "holder": "human:lnk_1", "since": 1.5}}
    fake.refuse = (409, taken)
    params = {"path": "/x", "wait_for_control_ms": "2000"}
    async with _client(app, token) as agent:
        down = await agent.get(f"/v1/sessions/{session.id}/files", params=params)
        up = await agent.put(f"/v1/sessions/{session.id}/files", params=params, content=b"data")
    for reply in (down, up):
        assert reply.status_code == 409 and reply.json() == taken
    assert all(r.url.params["wait_for_control_ms"] == "2000" for r in fake.requests)
    assert session.in_flight == 0


def test_a_refusal_is_read_by_its_code_and_an_unknown_one_is_file_failed() -> None:
    assert refusal(404, json.dumps(error_body("no_such_file", "gone")).encode()).code is ErrorCode.NO_SUCH_FILE
    odd = refusal(409, json.dumps(error_body("file_exists", "there", "destination")).encode())
    assert (odd.code, odd.message, odd.field) == (ErrorCode.FILE_FAILED, "file_exists: there", "destination")
    assert refusal(502, b"<html>").code is ErrorCode.FILE_FAILED


def test_the_controller_is_given_the_path_and_its_options_only() -> None:
    assert controller_params({"path": "/a", "make_dirs": "1", "token": "t"}) == {"path": "/a", "make_dirs": "1"}
    assert controller_params({"path_base64": "/w==", "mode": "0600"}) == {"path_base64": "/w==", "mode": "0600"}
    assert controller_params({"path": "/a", "wait_for_control_ms": "5"}) == {"path": "/a", "wait_for_control_ms": "5"}
    with pytest.raises(InvalidRequest):
        controller_params({"make_dirs": "1"})


async def test_files_open_for_the_session_token_and_the_owners_key_only(
    files_app: tuple[FastAPI, FakeController],
) -> None:
    app, fake = files_app
    session, token = await _session(app)
    (fake.root / "f").write_bytes(b"hi")
    where = f"/v1/sessions/{session.id}/files"
    for credential, status in ((None, 401), (OTHER_KEY, 403), ("not-a-token", 401), (KEY, 200), (token, 200)):
        async with _client(app, credential) as caller:
            assert (await caller.get(where, params={"path": "/f"})).status_code == status, credential
            put = await caller.put(where, params={"path": "/g"}, content=b"data")
            assert put.status_code == status, credential
    async with _client(app, token) as holder:
        missing = await holder.get(where)
    assert missing.status_code == 422 and missing.json()["error"] == {
        "code": "invalid_request",
        "message": "give ?path= (or ?path_base64=)",
        "field": "path",
    }


async def test_a_sandbox_that_does_not_answer_is_502(app: FastAPI, client: Client) -> None:
    manager: SessionManager = app.state.manager
    session, token = await manager.create(gateway_auth.key_id(KEY, KEY_ID_SECRET), CreateSession())
    async with client(token) as holder:
        up = await holder.put(f"/v1/sessions/{session.id}/files", params={"path": "/x"}, content=b"data")
        down = await holder.get(f"/v1/sessions/{session.id}/files", params={"path": "/x"})
    for reply in (up, down):
        assert reply.status_code == 502 and reply.json()["error"]["code"] == "sandbox_unreachable"
    assert session.in_flight == 0
