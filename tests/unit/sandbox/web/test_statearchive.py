"""The browser state's archive: what is packed, and every kind of hostile member refused before a
byte of it is written."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from corral.errors import StateRefused, StateTooLarge
from corral.sandbox.web.statearchive import member_problem, pack, unpack
from corral.sandbox.web.stateswap import is_browser_main


def _profile(root: Path) -> Path:
    (root / "Default" / "Local Storage" / "leveldb").mkdir(parents=True)
    (root / "Default" / "Cache").mkdir()
    (root / "Default" / "Cookies").write_bytes(b"cookies")
    (root / "Default" / "Local Storage" / "leveldb" / "000003.log").write_bytes(b"ls")
    (root / "Default" / "Cache" / "data_0").write_bytes(b"cache")
    (root / "Default" / "Preferences").write_text("{}")
    (root / "Local State").write_text("{}")
    os.symlink("/etc/passwd", root / "Default" / "IndexedDB")
    return root


def _tar(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"x", target: str = "") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, target
        info.size = len(data) if kind == tarfile.REGTYPE else 0
        archive.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    return out.getvalue()


def test_pack_keeps_the_state_and_nothing_else_and_never_follows_a_link(tmp_path: Path) -> None:
    data = pack(_profile(tmp_path / "p"), 1 << 20)
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        names = sorted(archive.getnames())
    assert names == [
        "Default/Cookies",
        "Default/Local Storage",
        "Default/Local Storage/leveldb",
        "Default/Local Storage/leveldb/000003.log",
    ]


def test_a_round_trip_gives_the_same_files(tmp_path: Path) -> None:
    data = pack(_profile(tmp_path / "p"), 1 << 20)
    written = unpack(data, tmp_path / "staging", 1 << 20)
    assert written == len(b"cookies") + len(b"ls")
    assert (tmp_path / "staging" / "Default" / "Cookies").read_bytes() == b"cookies"
    assert (tmp_path / "staging" / "Default" / "Local Storage" / "leveldb" / "000003.log").read_bytes() == b"ls"


def test_pack_over_the_cap_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StateTooLarge):
        pack(_profile(tmp_path / "p"), 3)


@pytest.mark.parametrize(
    ("archive", "why"),
    [
        (_tar("Default/Cookies", tarfile.SYMTYPE, target="/etc/passwd"), "link"),
        (_tar("Default/Cookies", tarfile.LNKTYPE, target="Default/x"), "link"),
        (_tar("Default/IndexedDB/dev", tarfile.CHRTYPE), "device"),
        (_tar("Default/IndexedDB/fifo", tarfile.FIFOTYPE), "device"),
        (_tar("Default/Local Storage/../../escape"), "'..'"),
        (_tar("/etc/cron.d/x"), "relative"),
        (_tar("Default/Preferences"), "not part"),
        (_tar("Local State"), "not part"),
        (b"not gzip at all", "gzipped"),
    ],
)
def test_hostile_members_are_refused_and_nothing_is_written_outside(tmp_path: Path, archive: bytes, why: str) -> None:
    with pytest.raises(StateRefused, match=why):
        unpack(archive, tmp_path / "staging", 1 << 20)
    assert not (tmp_path / "escape").exists()


def test_a_gzip_bomb_stops_at_the_header_that_declares_too_much(tmp_path: Path) -> None:
    bomb = _tar("Default/IndexedDB/zeros", data=bytes(4 << 20))
    assert len(bomb) < 64 << 10
    with pytest.raises(StateTooLarge):
        unpack(bomb, tmp_path / "staging", 1 << 20)


def test_an_archive_over_the_cap_is_refused_before_it_is_opened(tmp_path: Path) -> None:
    with pytest.raises(StateTooLarge):
        unpack(b"x" * 11, tmp_path / "staging", 10)


def test_member_rules_are_pure() -> None:
    assert member_problem("Default", "dir") is None
    assert member_problem("Default/WebStorage/1/IndexedDB/x", "file") is None
    assert member_problem("Default/Cookies", "link") is not None
    assert member_problem("", "file") is not None
    assert member_problem("Default/./Cookies", "file") is not None


def test_only_chromiums_browser_process_is_stopped() -> None:
    assert is_browser_main(["/usr/lib/chromium/chromium", "--remote-debugging-port=9222"])
    assert not is_browser_main(["/usr/lib/chromium/chromium", "--type=renderer"])
    assert not is_browser_main(["setpriv", "--reuid=browser", "--", "chromium"])
    assert not is_browser_main([])
