"""Directories between this host and a sandbox: which files an upload sends, and a tar unpacked with
nothing let out of its target directory."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from corral.errors import CorralError
from corral.gateway_client import Download
from corral.transfer import settle, unpack, upload_plan


def test_an_upload_plan_is_every_regular_file_under_the_directory_and_no_link(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "sub" / "deeper").mkdir(parents=True)
    (tree / "a.txt").write_text("a")
    (tree / "sub" / "deeper" / "b.bin").write_bytes(b"b")
    (tree / "link").symlink_to("/etc/passwd")  # a link could point anywhere on this host
    (tree / "empty").mkdir()
    assert upload_plan(tree, "/workspace/t") == [
        (tree / "a.txt", "/workspace/t/a.txt"),
        (tree / "sub" / "deeper" / "b.bin", "/workspace/t/sub/deeper/b.bin"),
    ]
    assert upload_plan(tree / "a.txt", "/w/x.txt") == [(tree / "a.txt", "/w/x.txt")]


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for info, data in members:
            info.size = len(data) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return path


def _file(name: str) -> tarfile.TarInfo:
    return tarfile.TarInfo(name)


def _link(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info


def test_a_directory_tar_unpacks_into_the_target(tmp_path: Path) -> None:
    folder = tarfile.TarInfo("./sub")
    folder.type, folder.mode = tarfile.DIRTYPE, 0o755
    archive = _tar(
        tmp_path / "ok.tar", [(folder, b""), (_file("./sub/x.txt"), b"hello"), (_link("./ln", "sub/x.txt"), b"")]
    )
    unpack(archive, tmp_path / "out")
    assert (tmp_path / "out" / "sub" / "x.txt").read_bytes() == b"hello"
    assert (tmp_path / "out" / "ln").resolve() == (tmp_path / "out" / "sub" / "x.txt").resolve()


@pytest.mark.parametrize(
    "member",
    [
        _file("../escaped"),
        _file("/tmp/absolute"),
        _file("sub/../../escaped"),
        _link("out-link", "/etc/passwd"),
        _link("up", "../../x"),
    ],
    ids=["dotdot", "absolute", "nested-dotdot", "absolute-link", "link-out"],
)
def test_no_member_lands_outside_the_target(tmp_path: Path, member: tarfile.TarInfo) -> None:
    archive = _tar(tmp_path / "evil.tar", [(member, b"x")])
    with pytest.raises(CorralError, match="refused to unpack"):
        unpack(archive, tmp_path / "out")
    assert not (tmp_path / "escaped").exists() and not Path("/tmp/absolute").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evil.tar", "out"]
    assert list((tmp_path / "out").iterdir()) == []


def test_settle_renames_a_file_and_unpacks_a_tar(tmp_path: Path) -> None:
    (tmp_path / "f.part").write_bytes(b"plain")
    assert settle(Download(tmp_path / "f.part", 5, "application/octet-stream"), tmp_path / "f") == tmp_path / "f"
    assert (tmp_path / "f").read_bytes() == b"plain" and not (tmp_path / "f.part").exists()
    archive = _tar(tmp_path / "d.part", [(_file("./a"), b"A")])
    settle(Download(archive, 1, "application/x-tar"), tmp_path / "d")
    assert (tmp_path / "d" / "a").read_bytes() == b"A" and not archive.exists()


def test_something_that_is_no_tar_is_said_so(tmp_path: Path) -> None:
    (tmp_path / "x.tar").write_bytes(b"not a tar at all" * 100)
    with pytest.raises(CorralError, match="no tar archive"):
        unpack(tmp_path / "x.tar", tmp_path / "out")
