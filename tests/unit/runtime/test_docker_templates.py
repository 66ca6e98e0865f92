"""The Docker driver's template reads that need no engine: archives read as they stream."""

from __future__ import annotations

import io
import tarfile

import pytest

from corral.errors import SandboxError
from corral.runtime.docker.templates import entry_digests


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
