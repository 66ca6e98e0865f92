"""PUT and GET /v1/files through the controller's app and its door, over the plain-os AgentFs fake:
streamed in and out, capped, all or nothing, directories as tar, errors in the one error body."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import io
import json
import os
import tarfile
import urllib.parse
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.contracts import auth
from corral.errors import StreamAborted
from corral.sandbox.agent.launcher.client import Spawned, SpawnRefused
from corral.sandbox.agent.launcher.messages import ShepherdEvent
from corral.sandbox.app import create_app
from corral.sandbox.control.lease import ControlLease
from corral.sandbox.settings import ControllerSettings
from corral.sandbox.tools.files import TEMP_PREFIX, AgentFiles
from corral.sandbox.tools.transfer import LauncherCommand

from ..fakefs import FakeAgentFs

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette's note about httpx, on import
    from starlette.testclient import TestClient

SECRET = auth.new_secret()
RAW = {"content-type": "application/octet-stream"}


class Tar:
    """The launcher's spawn, stood in for by a subprocess of the test's own uid."""

    def __init__(self) -> None:
        self.argv: list[str] = []

    async def stdout(self, argv: list[str], cwd: str) -> AsyncIterator[bytes]:
        self.argv = argv
        process = await asyncio.create_subprocess_exec(*argv, cwd=cwd, stdout=asyncio.subprocess.PIPE)
        return self._read(process)

    @staticmethod
    async def _read(process: asyncio.subprocess.Process) -> AsyncIterator[bytes]:
        assert process.stdout is not None
        while chunk := await process.stdout.read(1 << 16):
            yield chunk
        await process.wait()


class Controller:
    def __init__(self, root: Path, client: TestClient, fs: FakeAgentFs, tar: Tar) -> None:
        self.root, self.client, self.fs, self.tar = root, client, fs, tar

    def put(self, params: dict[str, str], body: bytes | Iterator[bytes], **headers: str) -> dict[str, object]:
        reply = self.client.put(
            "/v1/files", params=params, content=body, headers=auth.sign(SECRET).headers | RAW | headers
        )
        return {"status": reply.status_code, **reply.json()}

    def get(self, params: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        reply = self.client.get("/v1/files", params=params, headers=auth.sign(SECRET).headers)
        return reply.status_code, dict(reply.headers), reply.content

    def leftovers(self) -> list[str]:
        return [name for _, _, names in os.walk(self.root) for name in names if name.startswith(TEMP_PREFIX)]


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Controller]:
    app = create_app(ControllerSettings(record=False, max_upload_bytes=1000))
    # Wired by hand as the lifespan would (it starts the desktop, which needs X).
    app.state.verifier = auth.RequestVerifier(SECRET)
    fs, tar = FakeAgentFs(), Tar()
    app.state.files = AgentFiles(fs, workspace=str(tmp_path))
    app.state.agent_command = tar
    yield Controller(tmp_path, TestClient(app), fs, tar)  # no `with`: that would run the lifespan


def test_put_streams_a_body_into_place_and_get_gives_it_back(controller: Controller) -> None:
    data = bytes(range(256)) * 3

    def chunks() -> Iterator[bytes]:
        yield data[:100]
        yield data[100:]

    reply = controller.put({"path": "in/blob.bin", "make_dirs": "1", "mode": "0600"}, chunks())
    target = controller.root / "in" / "blob.bin"
    assert reply == {
        "status": 200,
        "ok": True,
        "path": str(target),
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    assert target.read_bytes() == data and (target.stat().st_mode & 0o777) == 0o600
    status, headers, body = controller.get({"path": "in/blob.bin"})
    assert (status, body) == (200, data)
    assert headers["content-type"] == "application/octet-stream" and headers["content-length"] == str(len(data))
    assert controller.leftovers() == []


def test_while_a_human_holds_the_lease_transfers_are_refused_with_the_holder(controller: Controller) -> None:
    lease = ControlLease(clock=lambda: 1700000000.5)
    controller.client.app.state.lease = lease  # type: ignore[attr-defined]
    (controller.root / "kept.txt").write_bytes(b"kept")
    lease.take("human:lnk_1")
    status, _, body = controller.get({"path": "kept.txt"})
    refused = {"code": "control_taken", "holder": "human:lnk_1", "since": 1700000000.5}
    assert status == 409 and {k: v for k, v in json.loads(body)["error"].items() if k != "message"} == refused
    reply = controller.put({"path": "new.txt"}, iter([b"x"]))
    error = reply["error"]
    assert reply["status"] == 409 and isinstance(error, dict) and error["code"] == "control_taken"
    assert not (controller.root / "new.txt").exists()
    # A bad wait is the caller's error, named; a wait within bounds waits (here it runs out: refused).
    status, _, body = controller.get({"path": "kept.txt", "wait_for_control_ms": "600001"})
    assert status == 400 and json.loads(body)["error"]["field"] == "wait_for_control_ms"
    lease.release("human:lnk_1")
    assert controller.get({"path": "kept.txt"})[::2] == (200, b"kept")


def test_an_upload_over_the_cap_is_413_and_leaves_nothing(controller: Controller) -> None:
    (controller.root / "kept").write_bytes(b"old")
    declared = controller.put({"path": "kept"}, b"x" * 1001)
    assert declared["status"] == 413 and declared["error"] == {
        "code": "too_large",
        "message": "the upload is 1001 bytes; at most 1000",
        "field": "body",
    }
    assert controller.fs.calls == []  # refused on its declared length, before anything was touched

    def undeclared() -> Iterator[bytes]:  # chunked: no content-length, counted as it comes
        yield b"x" * 600
        yield b"y" * 600

    streamed = controller.put({"path": "kept"}, undeclared())
    assert streamed["status"] == 413
    assert (controller.root / "kept").read_bytes() == b"old" and controller.leftovers() == []


def test_a_full_disk_is_507_and_the_old_file_stays(controller: Controller) -> None:
    (controller.root / "kept").write_bytes(b"old")
    controller.fs.full = True
    reply = controller.put({"path": "kept"}, b"new")
    assert reply["status"] == 507 and reply["error"]["code"] == "no_space"  # type: ignore[index]
    assert (controller.root / "kept").read_bytes() == b"old" and controller.leftovers() == []


@pytest.mark.parametrize(
    ("params", "status", "code", "field"),
    [
        ({"path": "missing/dir/file"}, 404, "no_such_file", "path"),
        ({"path": "a\x00b"}, 400, "invalid_field", "path"),
        ({"path": "x", "mode": "9"}, 400, "invalid_field", "mode"),
        ({"path": "x", "bogus": "1"}, 400, "unknown_field", "bogus"),
        ({}, 400, "missing_field", "path"),
    ],
)
def test_bad_puts_get_the_one_error_body(
    controller: Controller, params: dict[str, str], status: int, code: str, field: str
) -> None:
    reply = controller.put(params, b"data")
    assert (reply["status"], reply["ok"]) == (status, False)
    error = reply["error"]
    assert isinstance(error, dict) and (error["code"], error["field"]) == (code, field)


def test_a_path_the_agent_may_not_read_is_403(controller: Controller) -> None:
    secret = controller.root / "secret"
    secret.write_text("x")
    controller.fs.denied.add(str(secret))
    status, _, body = controller.get({"path": str(secret)})
    assert status == 403 and b'"permission_denied"' in body
    assert controller.put({"path": str(secret)}, b"y")["status"] == 403
    assert secret.read_text() == "x" and controller.leftovers() == []


def test_get_of_what_is_not_there_or_not_a_file(controller: Controller) -> None:
    status, headers, body = controller.get({"path": "nothing"})
    assert status == 404 and headers["content-type"] == "application/json" and b'"no_such_file"' in body
    os.mkfifo(controller.root / "pipe")
    status, _, body = controller.get({"path": "pipe"})
    assert status == 400 and b'"invalid_request"' in body


def test_a_directory_comes_as_a_tar_made_by_the_agent(controller: Controller) -> None:
    (controller.root / "proj" / "src").mkdir(parents=True)
    (controller.root / "proj" / "src" / "main.py").write_text("print(1)\n")
    (controller.root / "proj" / "README").write_text("hi")
    status, headers, body = controller.get({"path": "proj"})
    assert status == 200 and headers["content-type"] == "application/x-tar" and "content-length" not in headers
    assert controller.tar.argv[:3] == ["tar", "-C", str(controller.root / "proj")]
    with tarfile.open(fileobj=io.BytesIO(body)) as archive:
        names = sorted(name for name in archive.getnames() if name != ".")
        main = archive.extractfile("./src/main.py")
        assert main is not None and main.read() == b"print(1)\n"
    assert names == ["./README", "./src", "./src/main.py"]
    controller.fs.denied.add(str(controller.root / "proj"))
    status, _, body = controller.get({"path": "proj"})
    assert status == 403 and b'"permission_denied"' in body


def test_a_sparse_file_over_the_cap_is_refused_before_a_byte_by_its_apparent_size(controller: Controller) -> None:
    with (controller.root / "sparse").open("wb") as sparse:
        sparse.truncate(1 << 40)  # 1 TB of holes: nothing on disk, all of it counted
    status, _, body = controller.get({"path": "sparse", "max_bytes": "4096"})
    assert status == 413 and len(body) < 1000
    error = json.loads(body)["error"]
    assert error["code"] == "too_large" and error["field"] == "path"
    assert (
        f"{1 << 40} bytes" in error["message"]
        and "limited to 4096 bytes (CORRAL_MAX_DOWNLOAD_BYTES)" in error["message"]
    )


def test_without_the_gateways_cap_the_controllers_own_holds(controller: Controller) -> None:
    (controller.root / "small").write_bytes(b"s" * 1000)
    controller.client.app.state.max_download = 999  # type: ignore[attr-defined]
    status, _, body = controller.get({"path": "small"})
    assert status == 413 and json.loads(body)["error"]["code"] == "too_large"
    assert controller.get({"path": "small", "max_bytes": "1000"})[0] == 200  # the gateway's cap wins


def test_a_directory_over_the_cap_by_a_sparse_file_is_refused_before_tar_starts(controller: Controller) -> None:
    (controller.root / "proj").mkdir()
    with (controller.root / "proj" / "sparse").open("wb") as sparse:
        sparse.truncate(100 << 30)
    status, _, body = controller.get({"path": "proj", "max_bytes": str(1 << 20)})
    assert status == 413 and json.loads(body)["error"]["code"] == "too_large"
    assert controller.tar.argv[0] == "du"  # tar never ran


def test_a_hard_link_farm_counts_its_file_once_and_stays_links_in_the_tar(controller: Controller) -> None:
    farm = controller.root / "farm"
    farm.mkdir()
    (farm / "big").write_bytes(os.urandom(100_000))
    for n in range(200):  # 20 MB were each link a copy
        os.link(farm / "big", farm / f"link{n}")
    status, _, body = controller.get({"path": "farm", "max_bytes": "400000"})
    assert status == 200 and controller.tar.argv[0] == "tar"
    assert len(body) < 400_000  # the file once, and a header per link
    with tarfile.open(fileobj=io.BytesIO(body)) as archive:
        members = [m for m in archive.getmembers() if m.name != "."]
    assert len(members) == 201 and sum(m.islnk() for m in members) == 200


def test_a_name_that_is_not_utf8_travels_as_path_base64(controller: Controller) -> None:
    raw = os.fsencode(str(controller.root)) + b"/caf\xe9"
    encoded = base64.b64encode(raw).decode()
    reply = controller.put({"path_base64": encoded}, b"latin")
    assert reply["status"] == 200 and reply["path_base64"] == encoded
    status, _, body = controller.get({"path_base64": encoded})
    assert (status, body) == (200, b"latin")


def test_without_a_launcher_transfers_are_unsupported(tmp_path: Path) -> None:
    app = create_app(ControllerSettings(record=False))
    app.state.verifier = auth.RequestVerifier(SECRET)
    client = TestClient(app)
    reply = client.put("/v1/files", params={"path": "x"}, content=b"x", headers=auth.sign(SECRET).headers | RAW)
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "unsupported"


class StubControl:
    """A shepherd's channel: the events it will report (then its end), and whether it was closed."""

    def __init__(self, events: list[ShepherdEvent] | None = None) -> None:
        self.closed = False
        self.events: list[ShepherdEvent | None] = [*(events or []), None]

    async def next_event(self) -> ShepherdEvent | None:
        return self.events.pop(0) if len(self.events) > 1 else None

    def close(self) -> None:
        self.closed = True


class StubLauncher:
    """The launcher's spawn: refuses, or 'starts' by writing into the stdout it was handed."""

    def __init__(
        self, refuse: SpawnRefused | None = None, output: bytes = b"", events: list[ShepherdEvent] | None = None
    ) -> None:
        self.refuse, self.output = refuse, output
        self.control = StubControl(events)
        self.seen: list[tuple[list[bytes], list[bytes], bytes]] = []

    async def spawn(
        self, argv: list[bytes], env: list[bytes], cwd: bytes, stdio: tuple[int, int, int], *, pty: bool = False
    ) -> Spawned | SpawnRefused:
        self.seen.append((argv, env, cwd))
        if self.refuse is not None:
            return self.refuse
        os.write(stdio[1], self.output)
        return Spawned(4242, self.control)  # type: ignore[arg-type]


async def test_tar_that_cannot_start_fails_before_anything_is_sent() -> None:
    launcher = StubLauncher(refuse=SpawnRefused("cwd", 13, "/home/x"))
    command = LauncherCommand(launcher)  # type: ignore[arg-type]
    with pytest.raises(PermissionError):
        await command.stdout(["tar", "-cf", "-", "."], "/home/x")
    argv, env, cwd = launcher.seen[0]
    assert argv == [b"tar", b"-cf", b"-", b"."] and cwd == b"/home/x"
    assert not any(item.startswith((b"HTTP_PROXY", b"CORRAL_")) for item in env)  # nothing of the controller's


async def test_tar_output_is_streamed_and_its_tree_killed_when_the_reader_stops() -> None:
    launcher = StubLauncher(output=b"x" * 5000)
    body = await LauncherCommand(launcher).stdout(["tar"], "/")  # type: ignore[arg-type]
    first = await anext(body)
    assert first and set(first) == {ord("x")}
    assert launcher.control.closed is False
    await body.aclose()  # the client went away mid-stream
    assert launcher.control.closed is True  # the shepherd kills what is left of tar's tree


class Events:
    """The recorder's seam for the routes: what they recorded, and whether with a frame."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.count = 0

    def arrived(self) -> int:
        self.count += 1
        return self.count

    def record(self, event: dict[str, Any], *, frame: bool = True) -> None:
        assert frame is False  # a transfer does not touch the screen
        self.events.append(event)


def test_uploads_and_downloads_are_recorded_one_event_each_never_their_bytes(controller: Controller) -> None:
    events = Events()
    controller.client.app.state.recorder = events  # type: ignore[attr-defined]
    data = b"secret bytes " * 50
    sha = hashlib.sha256(data).hexdigest()
    assert controller.put({"path": "up/f.bin", "make_dirs": "1"}, data)["status"] == 200
    assert controller.get({"path": "up/f.bin"})[2] == data
    (controller.root / "up" / "more.txt").write_text("more")
    _, _, tar = controller.get({"path": "up"})
    assert controller.get({"path": "nothing"})[0] == 404
    assert controller.put({"path": "big"}, b"x" * 1001)["status"] == 413
    upload, download, directory, missing, refused = events.events
    path = str(controller.root / "up" / "f.bin")
    assert upload["native"] == [{"type": "file_upload", "path": "up/f.bin", "make_dirs": "1"}]
    assert upload["request"] == {"http": "PUT /v1/files", "query": {"path": "up/f.bin", "make_dirs": "1"}}
    assert upload["ok"] is True and upload["dialect"] == "http" and upload["action_id"] is None
    assert upload["reply"]["result"] == {"direction": "upload", "path": path, "size": len(data), "sha256": sha}
    assert download["native"] == [{"type": "file_download", "path": "up/f.bin"}]
    assert download["reply"]["result"] == {
        "direction": "download",
        "path": path,
        "type": "file",
        "size": len(data),
        "sha256": sha,
        "complete": True,
    }
    dir_result = directory["reply"]["result"]
    assert (dir_result["type"], dir_result["size"]) == ("directory", len(tar))
    assert dir_result["sha256"] == hashlib.sha256(tar).hexdigest()  # the tar's, as sent
    assert missing["ok"] is False and missing["error"]["code"] == "no_such_file"
    assert refused["ok"] is False and refused["error"]["code"] == "too_large"
    assert refused["native"] == [{"type": "file_upload", "path": "big"}]
    assert "secret bytes" not in json.dumps(events.events)
    assert [event["request_seq"] for event in events.events] == [1, 2, 3, 4, 5]  # numbered as they came in
    assert all(event["started"] > 0 and event["elapsed_ms"] >= 0 for event in events.events)


async def _all(body: AsyncIterator[bytes]) -> bytes:
    return b"".join([chunk async for chunk in body])


@pytest.mark.parametrize("code", [0, 1], ids=["clean", "a-file-changed-while-read"])
async def test_a_tar_that_exits_well_ends_the_stream_cleanly(code: int) -> None:
    events = [ShepherdEvent("exited", pid=4242, exit_code=code), ShepherdEvent("empty")]
    launcher = StubLauncher(output=b"t" * 3000, events=events)
    body = await LauncherCommand(launcher).stdout(["tar"], "/")  # type: ignore[arg-type]
    assert await _all(body) == b"t" * 3000
    assert launcher.control.closed is True


@pytest.mark.parametrize(
    "events",
    [
        [ShepherdEvent("exited", pid=4242, exit_code=2), ShepherdEvent("empty")],
        [ShepherdEvent("exited", pid=4242, signal=9), ShepherdEvent("empty")],
        [],  # the shepherd went away without a word
    ],
    ids=["exit-2", "killed", "shepherd-gone"],
)
async def test_a_tar_that_fails_after_its_first_byte_aborts_the_stream(events: list[ShepherdEvent]) -> None:
    launcher = StubLauncher(output=b"t" * 3000, events=events)
    body = await LauncherCommand(launcher).stdout(["tar"], "/")  # type: ignore[arg-type]
    received = bytearray()
    with pytest.raises(StreamAborted):
        async for chunk in body:
            received += chunk
    assert received == b"t" * 3000  # all it wrote went out, then no clean end
    assert launcher.control.closed is True


def _open_fds() -> set[tuple[str, str]]:
    """This process's open fds, each with what it refers to."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own fd, gone by now
            found.add((fd, os.readlink(f"/proc/self/fd/{fd}")))
    return found


def _left_open(before: set[tuple[str, str]], root: Path) -> set[tuple[str, str]]:
    """What was opened since ``before`` and is still open: files under ``root`` and pipes. Only those:
    in CI this process also runs other tests' daemon threads, which may open sockets meanwhile."""
    return {(fd, to) for fd, to in _open_fds() - before if to.startswith((str(root), "pipe:"))}


async def _get_with_the_client_gone(controller: Controller, params: dict[str, str]) -> list[str]:
    """GET /v1/files through the ASGI app, the client gone before the first byte: its disconnect is the
    first thing the app hears, and the response's start never gets out. The message types sent."""
    app = controller.client.app
    headers = [(name.lower().encode(), value.encode()) for name, value in auth.sign(SECRET).headers.items()]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/v1/files",
        "raw_path": b"/v1/files",
        "root_path": "",
        "query_string": urllib.parse.urlencode(params).encode(),
        "headers": headers,
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 80),
    }
    sent: list[str] = []
    stuck = asyncio.Event()

    async def receive() -> dict[str, object]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, object]) -> None:
        sent.append(str(message["type"]))
        await stuck.wait()  # the socket is gone: nothing goes out

    await app(scope, receive, send)  # type: ignore[arg-type]
    return sent


async def test_a_directory_download_left_before_its_first_byte_leaves_no_tar_nor_fd(controller: Controller) -> None:
    (controller.root / "proj").mkdir()
    launcher = StubLauncher(output=b"t" * 3000)
    controller.client.app.state.agent_command = LauncherCommand(launcher)  # type: ignore[attr-defined]
    before = _open_fds()
    sent = await _get_with_the_client_gone(controller, {"path": "proj"})
    assert "http.response.body" not in sent
    assert launcher.control.closed is True  # the shepherd kills tar's tree
    assert _left_open(before, controller.root) == set()  # the pipe's read end closed too


async def test_a_file_download_left_before_its_first_byte_leaves_no_fd(controller: Controller) -> None:
    (controller.root / "big.bin").write_bytes(b"b" * 100_000)
    before = _open_fds()
    sent = await _get_with_the_client_gone(controller, {"path": "big.bin"})
    assert "http.response.body" not in sent
    assert _left_open(before, controller.root) == set()
