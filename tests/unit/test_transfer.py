"""Directories between this host and a sandbox: which files an upload sends, and a tar unpacked with
nothing let out of its target directory."""

from __future__ import annotations

import io
import os
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
    info = tarfile.TarInfo(name)
    info.mode = 0o644
    return info


def _link(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info


def _typed(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info


def _unterminated(path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    """A tar cut short at a member boundary: every member whole, tar's end-of-archive blocks missing."""
    data = bytearray()
    for info, content in members:
        info.size = len(content)
        data += info.tobuf(tarfile.GNU_FORMAT) + content + bytes(-len(content) % tarfile.BLOCKSIZE)
    path.write_bytes(bytes(data))
    return path


def _no_links_under(root: Path) -> bool:
    return not any(Path(top, name).is_symlink() for top, dirs, files in os.walk(root) for name in dirs + files)


def test_a_directory_tar_unpacks_into_the_target(tmp_path: Path) -> None:
    folder = tarfile.TarInfo("./sub")
    folder.type, folder.mode = tarfile.DIRTYPE, 0o755
    archive = _tar(
        tmp_path / "ok.tar", [(folder, b""), (_file("./sub/x.txt"), b"hello"), (_link("./ln", "sub/x.txt"), b"")]
    )
    assert unpack(archive, tmp_path / "out") == ["./ln"]  # a link is left out, even one pointing inside
    assert (tmp_path / "out" / "sub" / "x.txt").read_bytes() == b"hello"
    assert not (tmp_path / "out" / "ln").is_symlink() and not (tmp_path / "out" / "ln").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.tar", "out"]  # no scratch directory left


def test_a_file_through_a_link_devices_and_fifos_never_leave_the_target(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    archive = _tar(
        tmp_path / "evil.tar",
        [
            (_link("esc", str(outside)), b""),
            (_file("esc/pwned"), b"gotcha"),  # through the link, were it made
            (_link("up", "../outside"), b""),
            (_file("up/also"), b"gotcha"),
            (_typed("dev", tarfile.CHRTYPE), b""),
            (_typed("fifo", tarfile.FIFOTYPE), b""),
        ],
    )
    assert unpack(archive, tmp_path / "out") == ["esc", "up", "dev", "fifo"]
    assert list(outside.iterdir()) == []
    assert (tmp_path / "out" / "esc" / "pwned").read_bytes() == b"gotcha"  # a plain directory inside
    assert _no_links_under(tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["esc", "up"]


def test_a_hard_link_becomes_a_link_to_a_file_unpacked_before_it(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "h.tar", [(_file("a"), b"A" * 700), (_typed("sub/b", tarfile.LNKTYPE, "a"), b"")])
    assert unpack(archive, tmp_path / "out") == []
    assert (tmp_path / "out" / "sub" / "b").read_bytes() == b"A" * 700
    # One inode: a farm of links to one big file costs its size once here as in the sandbox.
    assert (tmp_path / "out" / "a").stat().st_ino == (tmp_path / "out" / "sub" / "b").stat().st_ino
    assert (tmp_path / "out" / "a").stat().st_nlink == 2


def test_a_hard_link_over_a_name_unpacked_before_is_refused(tmp_path: Path) -> None:
    archive = _tar(
        tmp_path / "h.tar", [(_file("a"), b"A"), (_file("b"), b"B"), (_typed("./b", tarfile.LNKTYPE, "a"), b"")]
    )
    with pytest.raises(CorralError):
        unpack(archive, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "members",
    [
        [(_file("../escaped"), b"x")],
        [(_file("/tmp/absolute"), b"x")],
        [(_file("sub/../../escaped"), b"x")],
        [(_typed("hard", tarfile.LNKTYPE, "/etc/passwd"), b"")],
        [(_typed("hard", tarfile.LNKTYPE, "../escaped"), b"")],
        [(_typed("hard", tarfile.LNKTYPE, "later"), b""), (_file("later"), b"x")],
        [(_file("a"), b"first"), (_file("a"), b"second")],
        [(_file("./a"), b"first"), (_file("a"), b"second")],
    ],
    ids=["dotdot", "absolute", "nested-dotdot", "hard-absolute", "hard-dotdot", "hard-forward", "twice", "twice-dot"],
)
def test_a_hostile_member_refuses_the_whole_archive_and_leaves_nothing(
    tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes]]
) -> None:
    archive = _tar(tmp_path / "evil.tar", [(_file("first"), b"1"), *members])
    with pytest.raises(CorralError, match="refused to unpack"):
        unpack(archive, tmp_path / "out")
    assert not (tmp_path / "escaped").exists() and not Path("/tmp/absolute").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evil.tar"]  # no target, no scratch


def test_an_archive_cut_short_at_a_member_boundary_is_refused(tmp_path: Path) -> None:
    archive = _unterminated(tmp_path / "cut.tar", [(_file("a"), b"A"), (_file("b"), b"B" * 600)])
    with pytest.raises(CorralError, match="cut short"):
        unpack(archive, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.tar"]


def test_a_member_cut_short_is_refused(tmp_path: Path) -> None:
    whole = _tar(tmp_path / "whole.tar", [(_file("a"), b"A" * 5000)])
    cut = tmp_path / "cut.tar"
    cut.write_bytes(whole.read_bytes()[: tarfile.BLOCKSIZE + 1000])
    with pytest.raises(CorralError):
        unpack(cut, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_existing_directory_is_not_merged_into(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine").write_text("keep")
    archive = _tar(tmp_path / "d.tar", [(_file("mine"), b"theirs")])
    with pytest.raises(CorralError, match="cannot unpack"):
        unpack(archive, tmp_path / "out")
    assert (tmp_path / "out" / "mine").read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.tar", "out"]


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
