"""The launcher's file operations resolve a path once and check what they opened (fsops.open_once):
a link swapped into a path between the check and the use can no longer lead them into /proc."""

from __future__ import annotations

import base64
import errno
import os
from pathlib import Path

import pytest

from corral.sandbox.agent.launcher import fsops


def _b(path: Path | str) -> bytes:
    return os.fsencode(path)


@pytest.mark.parametrize("target", ["/proc/self/status", "/proc/self", "/proc"])
def test_what_lies_on_proc_is_refused_on_the_object_opened(tmp_path: Path, target: str) -> None:
    (tmp_path / "link").symlink_to(target)
    for path in (_b(target), _b(tmp_path / "link")):
        with pytest.raises(PermissionError) as refused:
            fsops.open_once(path, os.O_RDONLY)
        assert refused.value.errno == errno.EACCES


def test_a_magic_link_is_never_followed(tmp_path: Path) -> None:
    (tmp_path / "fd").symlink_to("/proc/self/fd")
    for path in (b"/proc/self/fd/0", _b(tmp_path / "fd" / "0"), b"/proc/self/exe"):
        with pytest.raises(OSError) as refused:
            fsops.open_once(path, os.O_RDONLY)
        assert refused.value.errno in (errno.ELOOP, errno.EACCES), path


def test_files_and_links_outside_proc_open_and_describe_as_before(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "file").write_bytes(b"12345")
    (tmp_path / "dir" / "link").symlink_to("file")
    # As the controller asks: a mode with every open (openat2 alone would refuse it without O_CREAT).
    opened, fds = fsops.OPERATIONS["open"]({"path": _b(tmp_path / "dir" / "link"), "flags": os.O_RDONLY, "mode": 0o666})
    try:
        assert opened == {} and os.read(fds[0], 10) == b"12345"
    finally:
        os.close(fds[0])
    _, fds = fsops.OPERATIONS["open"](
        {"path": _b(tmp_path / "dir" / "new"), "flags": os.O_WRONLY | os.O_CREAT | os.O_EXCL, "mode": 0o640}
    )
    os.close(fds[0])
    assert (tmp_path / "dir" / "new").stat().st_mode & 0o777 == 0o640 & ~_umask()
    followed, _ = fsops.OPERATIONS["stat"]({"path": _b(tmp_path / "dir" / "link"), "follow_symlinks": True})
    assert (followed["stat"]["type"], followed["stat"]["size"], followed["stat"]["target"]) == ("file", 5, None)
    itself, _ = fsops.OPERATIONS["stat"]({"path": _b(tmp_path / "dir" / "link"), "follow_symlinks": False})
    assert (itself["stat"]["type"], base64.b64decode(itself["stat"]["target"])) == ("symlink", b"file")
    listed, _ = fsops.OPERATIONS["scandir"]({"path": _b(tmp_path / "dir"), "skip": 0, "limit": 10})
    entries = {base64.b64decode(e["path"]): e for e in listed["entries"]}
    assert set(entries) == {_b(tmp_path / "dir" / name) for name in ("file", "link", "new")}
    assert base64.b64decode(entries[_b(tmp_path / "dir" / "link")]["target"]) == b"file"


def test_stat_and_listing_refuse_proc_reached_through_a_link(tmp_path: Path) -> None:
    (tmp_path / "me").symlink_to("/proc/self")
    with pytest.raises(PermissionError):
        fsops.OPERATIONS["stat"]({"path": _b(tmp_path / "me" / "status"), "follow_symlinks": False})
    with pytest.raises(PermissionError):
        fsops.OPERATIONS["scandir"]({"path": _b(tmp_path / "me"), "skip": 0, "limit": 10})
    # The link itself is the agent's own file: described, not followed.
    itself, _ = fsops.OPERATIONS["stat"]({"path": _b(tmp_path / "me"), "follow_symlinks": False})
    assert itself["stat"]["type"] == "symlink"


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
