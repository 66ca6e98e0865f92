"""The Docker driver's template reads that need no engine: archives read as they stream."""

from __future__ import annotations

import io
import tarfile
from typing import Any

import pytest

from corral.errors import SandboxError
from corral.runtime.docker.templates import entry_digests, first_entry


def test_a_directorys_entries_by_one_archive_each_with_its_link_and_digest() -> None:
    """The check's libraries: one archive of a directory, its direct entries only, links kept as
    links, the content of the names asked for digested and the rest skipped; bounded."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for name, data in (("lib/", None), ("lib/libz.so.1.2.13", b"zlib"), ("lib/sub/deeper.so", b"x")):
            info = tarfile.TarInfo(name.rstrip("/"))
            if data is None:
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            else:
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("lib/libz.so.1")
        link.type, link.linkname = tarfile.SYMTYPE, "libz.so.1.2.13"
        archive.addfile(link)
    data = out.getvalue()

    entries = entry_digests(io.BytesIO(data), 1 << 20)
    assert set(entries) == {"libz.so.1.2.13", "libz.so.1"}  # direct entries only (not sub/deeper.so)
    assert entries["libz.so.1"].link == "libz.so.1.2.13" and entries["libz.so.1.2.13"].link is None
    changed = data.replace(b"zlib", b"evil")
    assert entry_digests(io.BytesIO(changed), 1 << 20)["libz.so.1.2.13"].digest != entries["libz.so.1.2.13"].digest
    only = entry_digests(io.BytesIO(data), 1 << 20, {"libz.so.1"})
    assert only["libz.so.1"] == entries["libz.so.1"] and only["libz.so.1.2.13"].digest == ""
    with pytest.raises(SandboxError, match="over"):
        entry_digests(io.BytesIO(data), 2)


def _archive(*members: tuple[str, bytes | None, str]) -> bytes:
    """A tar of (name, file data or None, link target or ""): a directory where both are empty."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for name, data, link in members:
            info = tarfile.TarInfo(name)
            if link:
                info.type, info.linkname = tarfile.SYMTYPE, link
                archive.addfile(info)
            elif data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                archive.addfile(info)
            else:
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_a_paths_own_entry_is_digested_as_its_directorys_archive_digests_it() -> None:
    """One path read by itself (the links of a merged /usr) gives the entry a read of its directory
    gives: the same digest for a file, a link and a directory, whichever way the check read it."""
    directory = _archive(
        ("usr", None, ""),
        ("usr/libz.so.1.2.13", b"zlib", ""),
        ("usr/libz.so.1", None, "libz.so.1.2.13"),
        ("usr/lib", None, ""),
        ("usr/lib/deeper.so", b"x", ""),
    )
    whole = entry_digests(io.BytesIO(directory), 1 << 20)
    assert first_entry(io.BytesIO(_archive(("libz.so.1.2.13", b"zlib", ""))), 1 << 20) == whole["libz.so.1.2.13"]
    assert first_entry(io.BytesIO(_archive(("libz.so.1", None, "libz.so.1.2.13"))), 1 << 20) == whole["libz.so.1"]
    # A directory's archive is its tree: its entry is the first, and what it holds changes nothing.
    tree = _archive(("lib", None, ""), ("lib/deeper.so", b"other", ""))
    assert first_entry(io.BytesIO(tree), 1 << 20) == whole["lib"]
    assert first_entry(io.BytesIO(_archive(("libz.so.1.2.13", b"evil", ""))), 1 << 20) != whole["libz.so.1.2.13"]


def test_a_paths_own_entry_reads_nothing_past_it_and_is_bounded() -> None:
    class Counted(io.RawIOBase):
        """A stream that says how much of it was read."""

        def __init__(self, data: bytes) -> None:
            self.data, self.read_bytes = data, 0

        def readable(self) -> bool:
            return True

        def readinto(self, buffer: Any) -> int:
            chunk = self.data[self.read_bytes : self.read_bytes + min(len(buffer), 4096)]
            buffer[: len(chunk)] = chunk
            self.read_bytes += len(chunk)
            return len(chunk)

    big = _archive(("usr", None, ""), *((f"usr/f{i}", b"x" * 100_000, "") for i in range(40)))
    stream = Counted(big)
    assert first_entry(stream, 1 << 20) is not None
    assert stream.read_bytes < 100_000 < len(big)  # the tree behind the directory's entry stays unread
    assert first_entry(io.BytesIO(b"\0" * 1024), 1 << 20) is None  # an empty archive: nothing there
    with pytest.raises(SandboxError, match="over"):
        first_entry(io.BytesIO(_archive(("big", b"x" * 5000, ""))), 4096)
