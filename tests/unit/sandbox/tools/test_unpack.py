"""corral.sandbox.tools.unpack: a paused session's archive (the sandbox's, an attacker's) put back
only under its target: absolute and ``..`` paths, links out, devices and too many bytes refused."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from corral.sandbox.tools.unpack import EXIT_REFUSED, Refused, main, unpack


def _archive(path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> str:
    with tarfile.open(path, "w") as tar:
        for info, data in members:
            info.size = len(data) if info.type == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if data else None)
    return str(path)


def _file(name: str, mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mode = mode
    return info


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def test_a_workspace_comes_back_with_its_files_and_inner_links(tmp_path: Path) -> None:
    sub = tarfile.TarInfo("./src")
    sub.type = tarfile.DIRTYPE
    archive = _archive(
        tmp_path / "a.tar",
        [(sub, b""), (_file("./src/app.py"), b"print(1)\n"), (_link("./src/bin", "../src/app.py"), b"")],
    )
    done = unpack(archive, str(tmp_path / "ws"), 1 << 20)
    assert (tmp_path / "ws/src/app.py").read_text() == "print(1)\n"
    assert (tmp_path / "ws/src/bin").resolve() == (tmp_path / "ws/src/app.py").resolve()
    assert done.bytes == 9


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (_file("/etc/passwd"), "absolute"),
        (_file("../outside"), ".."),
        (_file("a/../../outside"), ".."),
        (_link("hard", "../x", tarfile.LNKTYPE), ".."),
        (_link("hard", "/etc/passwd", tarfile.LNKTYPE), "absolute"),
    ],
)
def test_a_member_reaching_out_is_refused(tmp_path: Path, member: tarfile.TarInfo, why: str) -> None:
    archive = _archive(tmp_path / "a.tar", [(member, b"x" if member.type == tarfile.REGTYPE else b"")])
    with pytest.raises(Refused, match=why):
        unpack(archive, str(tmp_path / "ws"), 1 << 20)
    assert not (tmp_path / "outside").exists()


def test_links_out_are_made_but_never_written_through(tmp_path: Path) -> None:
    """A venv's absolute link comes back as a link; a member under a link that leads out, a chain of
    links that climbs out, or a file on a link's name, is refused before anything is written."""
    outside = tmp_path / "outside"
    outside.mkdir()
    venv = _archive(tmp_path / "venv.tar", [(_link(".venv/bin/python", "/usr/bin/python3"), b"")])
    unpack(venv, str(tmp_path / "ws"), 1 << 20)
    assert os.readlink(tmp_path / "ws/.venv/bin/python") == "/usr/bin/python3"
    attacks = [
        [(_link("escape", str(outside)), b""), (_file("escape/planted"), b"x")],
        [(_link("l1", "."), b""), (_link("l2", "l1/../../outside"), b""), (_file("l2/planted"), b"x")],
        [(_link("name", str(outside / "planted")), b""), (_file("name"), b"x")],
    ]
    for n, members in enumerate(attacks):
        with pytest.raises(Refused, match="outside the target"):
            unpack(_archive(tmp_path / f"attack{n}.tar", members), str(tmp_path / f"ws{n}"), 1 << 20)
    assert list(outside.iterdir()) == []


def test_a_file_through_a_link_out_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "away").symlink_to(tmp_path)  # left by an earlier step: still not followed out
    archive = _archive(tmp_path / "a.tar", [(_file("away/planted"), b"x")])
    with pytest.raises(Refused, match="outside the target"):
        unpack(archive, str(tmp_path / "ws"), 1 << 20)
    assert not (tmp_path / "planted").exists()


def test_devices_and_fifos_are_refused(tmp_path: Path) -> None:
    fifo = tarfile.TarInfo("pipe")
    fifo.type = tarfile.FIFOTYPE
    with pytest.raises(Refused, match="not a file"):
        unpack(_archive(tmp_path / "a.tar", [(fifo, b"")]), str(tmp_path / "ws"), 1 << 20)


def test_setuid_bits_are_dropped_and_the_cap_holds(tmp_path: Path) -> None:
    archive = _archive(tmp_path / "a.tar", [(_file("tool", 0o4755), b"#!/bin/sh\n")])
    unpack(archive, str(tmp_path / "ws"), 1 << 20)
    assert (tmp_path / "ws/tool").stat().st_mode & 0o7777 == 0o755
    big = _archive(tmp_path / "b.tar", [(_file("a"), b"x" * 10), (_file("b"), b"x" * 10)])
    with pytest.raises(Refused, match="more than 15 bytes"):
        unpack(big, str(tmp_path / "ws2"), 15)


def test_main_removes_the_archive_and_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    archive = _archive(tmp_path / "a.tar", [(_file("/abs"), b"x")])
    assert main([archive, str(tmp_path / "ws"), "100"]) == EXIT_REFUSED
    assert not Path(archive).exists()
    assert "absolute" in capsys.readouterr().err
