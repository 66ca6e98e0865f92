"""``corral cp``: files and directories into a session (file by file) and out of it (a directory as a
tar, unpacked with nothing let out), through the CLI's gateway client over a fake transport."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Self

import httpx
import pytest
from typer.testing import CliRunner

from corral.cli import app, common
from corral.errors import ActionFailed, error_body

from .conftest import Handler

Gateway = Callable[[Handler], list[httpx.Request]]


class RemoteStat:
    """The session's WebSocket, as ``cp`` uses it: ``file_stat`` answered from ``types`` (a path's
    type), ``no_such_file`` for any other path; keeps the paths asked about."""

    def __init__(self) -> None:
        self.types: dict[str, str] = {}
        self.asked: list[str] = []

    def __call__(self, session_id: str) -> Self:
        return self

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def act(self, action: dict[str, Any]) -> dict[str, Any]:
        assert action["type"] == "file_stat"
        self.asked.append(action["path"])
        if action["path"] not in self.types:
            raise ActionFailed({"code": "no_such_file", "message": "no such file", "field": "action.path"})
        return {"ok": True, "id": 1, "result": {"path": action["path"], "type": self.types[action["path"]]}}


@pytest.fixture(autouse=True)
def remote(monkeypatch: pytest.MonkeyPatch) -> RemoteStat:
    stat = RemoteStat()
    monkeypatch.setattr(common, "sandbox_client", stat)
    return stat


def _written(request: httpx.Request) -> httpx.Response:
    body = request.read()
    return httpx.Response(200, json={"ok": True, "path": request.url.params["path"], "size": len(body), "sha256": "x"})


def test_a_file_goes_up_to_its_path(gateway: Gateway, tmp_path: Path) -> None:
    seen = gateway(_written)
    (tmp_path / "a.txt").write_bytes(b"hello")
    result = CliRunner().invoke(app, ["cp", str(tmp_path / "a.txt"), "ses_1:/workspace/b.txt"])
    assert result.exit_code == 0, result.output
    [request] = seen
    assert (request.method, request.url.path) == ("PUT", "/v1/sessions/ses_1/files")
    assert dict(request.url.params) == {"path": "/workspace/b.txt"}
    assert request.content == b"hello" and request.headers["authorization"] == "Bearer key-1"
    assert "uploaded 1 file (5 bytes)" in result.stderr


def test_a_file_goes_into_a_remote_directory_with_parents_made(gateway: Gateway, tmp_path: Path) -> None:
    seen = gateway(_written)
    (tmp_path / "a.txt").write_bytes(b"hello")
    result = CliRunner().invoke(app, ["cp", "-p", str(tmp_path / "a.txt"), "ses_1:/workspace/new/"])
    assert result.exit_code == 0, result.output
    assert dict(seen[0].url.params) == {"path": "/workspace/new/a.txt", "make_dirs": "1"}


def test_a_directory_goes_up_file_by_file(gateway: Gateway, tmp_path: Path) -> None:
    seen = gateway(_written)
    tree = tmp_path / "src"
    (tree / "pkg").mkdir(parents=True)
    (tree / "main.py").write_text("print(1)")
    (tree / "pkg" / "mod.py").write_text("x = 1")
    (tree / "secret").symlink_to("/etc/hostname")
    result = CliRunner().invoke(app, ["cp", str(tree), "ses_1:/workspace/app"])
    assert result.exit_code == 0, result.output
    assert [dict(request.url.params) for request in seen] == [
        {"path": "/workspace/app/main.py", "make_dirs": "1"},
        {"path": "/workspace/app/pkg/mod.py", "make_dirs": "1"},
    ]
    assert [request.content for request in seen] == [b"print(1)", b"x = 1"]


def test_a_file_comes_down_to_a_new_path_or_into_a_directory(gateway: Gateway, tmp_path: Path) -> None:
    seen = gateway(
        lambda request: httpx.Response(200, content=b"\x00data", headers={"content-type": "application/octet-stream"})
    )
    runner = CliRunner()
    assert runner.invoke(app, ["cp", "ses_1:/workspace/r.bin", str(tmp_path / "copy.bin")]).exit_code == 0
    assert (tmp_path / "copy.bin").read_bytes() == b"\x00data"
    (tmp_path / "dir").mkdir()
    assert runner.invoke(app, ["cp", "ses_1:/workspace/r.bin", str(tmp_path / "dir")]).exit_code == 0
    assert (tmp_path / "dir" / "r.bin").read_bytes() == b"\x00data"
    assert [dict(request.url.params) for request in seen] == [{"path": "/workspace/r.bin"}] * 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.bin", "dir"]  # no partial file left


def _tar(names: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in names.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_a_directory_comes_down_as_a_tar_and_is_unpacked(gateway: Gateway, tmp_path: Path) -> None:
    archive = _tar({"./a.txt": b"A", "./sub/b.txt": b"B"})
    gateway(lambda request: httpx.Response(200, content=archive, headers={"content-type": "application/x-tar"}))
    result = CliRunner().invoke(app, ["cp", "ses_1:/workspace/out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "a.txt").read_bytes() == b"A"
    assert (tmp_path / "out" / "sub" / "b.txt").read_bytes() == b"B"
    assert "downloaded directory" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_tar_with_a_member_out_of_the_target_is_refused(gateway: Gateway, tmp_path: Path) -> None:
    archive = _tar({"./fine.txt": b"ok", "../escaped.txt": b"gotcha"})
    gateway(lambda request: httpx.Response(200, content=archive, headers={"content-type": "application/x-tar"}))
    result = CliRunner().invoke(app, ["cp", "ses_1:/workspace/out", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert "refused to unpack" in result.stderr
    assert not (tmp_path / "escaped.txt").exists()
    assert not any(p.name.endswith(".corral-cp") for p in tmp_path.iterdir())  # the tar is gone too


def test_a_refusal_is_a_clean_failure(gateway: Gateway, tmp_path: Path) -> None:
    gateway(lambda request: httpx.Response(404, json=error_body("no_such_file", "'/nope': No such file", "path")))
    result = CliRunner().invoke(app, ["cp", "ses_1:/nope", str(tmp_path / "x")])
    assert result.exit_code == 1
    assert "404 no_such_file" in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [["cp", "a", "b"], ["cp", "ses_1:/a", "ses_1:/b"]])
def test_one_side_is_remote_the_other_local(gateway: Gateway, args: list[str]) -> None:
    seen = gateway(_written)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and seen == []


def test_a_missing_local_source_is_said_so(gateway: Gateway, tmp_path: Path) -> None:
    seen = gateway(_written)
    result = CliRunner().invoke(app, ["cp", str(tmp_path / "nope"), "ses_1:/w/x"])
    assert result.exit_code == 2 and "no such file" in result.stderr and seen == []


class _CutShort(httpx.SyncByteStream):
    """A body whose connection drops after its first chunk (no clean end of the chunked stream)."""

    def __init__(self, first: bytes) -> None:
        self._first = first

    def __iter__(self) -> Iterator[bytes]:
        yield self._first
        raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")


@pytest.mark.parametrize("media", ["application/x-tar", "application/octet-stream"])
def test_a_download_cut_short_by_the_connection_fails_and_leaves_nothing(
    gateway: Gateway, tmp_path: Path, media: str
) -> None:
    archive = _tar({"./a.txt": b"A" * 3000})
    gateway(lambda request: httpx.Response(200, stream=_CutShort(archive[:1536]), headers={"content-type": media}))
    result = CliRunner().invoke(app, ["cp", "ses_1:/workspace/out", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert "cannot copy: the download was cut short" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_tar_that_ends_cleanly_but_early_fails_and_leaves_nothing(gateway: Gateway, tmp_path: Path) -> None:
    archive = _tar({"./a.txt": b"A", "./b.txt": b"B"})
    cut = archive[: 2 * tarfile.BLOCKSIZE]  # a.txt whole, then nothing: no end-of-archive blocks
    gateway(lambda request: httpx.Response(200, content=cut, headers={"content-type": "application/x-tar"}))
    result = CliRunner().invoke(app, ["cp", "ses_1:/workspace/out", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert "cut short" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_links_left_out_of_a_directory_are_named(gateway: Gateway, tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        link = tarfile.TarInfo("./ln")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    archive = buffer.getvalue()
    gateway(lambda request: httpx.Response(200, content=archive, headers={"content-type": "application/x-tar"}))
    result = CliRunner().invoke(app, ["cp", "ses_1:/workspace/out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "left out 1" in result.stderr and "./ln" in result.stderr
    assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize("destination", ["ses_1:", "ses_1:/workspace", "ses_1:/workspace/"])
def test_a_file_copied_to_an_existing_remote_directory_goes_inside_it(
    gateway: Gateway, remote: RemoteStat, tmp_path: Path, destination: str
) -> None:
    seen = gateway(_written)
    remote.types["/workspace"] = "directory"
    (tmp_path / "a.txt").write_bytes(b"hello")
    result = CliRunner().invoke(app, ["cp", str(tmp_path / "a.txt"), destination])
    assert result.exit_code == 0, result.output
    assert dict(seen[0].url.params) == {"path": "/workspace/a.txt"}
    assert "to ses_1:/workspace/a.txt" in result.stderr


@pytest.mark.parametrize("existing", [None, "file"], ids=["new", "replaced"])
def test_a_file_copied_to_a_remote_path_that_is_no_directory_goes_there(
    gateway: Gateway, remote: RemoteStat, tmp_path: Path, existing: str | None
) -> None:
    seen = gateway(_written)
    if existing is not None:
        remote.types["/workspace/b.txt"] = existing
    (tmp_path / "a.txt").write_bytes(b"hello")
    result = CliRunner().invoke(app, ["cp", str(tmp_path / "a.txt"), "ses_1:/workspace/b.txt"])
    assert result.exit_code == 0, result.output
    assert dict(seen[0].url.params) == {"path": "/workspace/b.txt"} and remote.asked == ["/workspace/b.txt"]
