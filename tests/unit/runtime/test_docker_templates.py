"""The Docker driver's template reads that need no engine: archives read as they stream."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import docker
import docker.errors
import pytest

from corral.errors import SandboxError
from corral.runtime.docker.templates import TemplateImages, entry_digests, first_entry


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
    own = _archive(("libz.so.1.2.13", b"zlib", ""))
    assert first_entry(io.BytesIO(own), 1 << 20, "libz.so.1.2.13") == whole["libz.so.1.2.13"]
    link = _archive(("libz.so.1", None, "libz.so.1.2.13"))
    assert first_entry(io.BytesIO(link), 1 << 20, "libz.so.1") == whole["libz.so.1"]
    # A directory's archive is its tree: its entry is the first, and what it holds changes nothing.
    tree = _archive(("lib", None, ""), ("lib/deeper.so", b"other", ""))
    assert first_entry(io.BytesIO(tree), 1 << 20, "lib") == whole["lib"]
    evil = _archive(("libz.so.1.2.13", b"evil", ""))
    assert first_entry(io.BytesIO(evil), 1 << 20, "libz.so.1.2.13") != whole["libz.so.1.2.13"]
    # An archive that does not begin with the path itself (the engine skipped it): no entry taken.
    with pytest.raises(SandboxError, match="begins with"):
        first_entry(io.BytesIO(_archive(("lib/deeper.so", b"x", ""))), 1 << 20, "lib")


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
    assert first_entry(stream, 1 << 20, "usr") is not None
    assert stream.read_bytes < 100_000 < len(big)  # the tree behind the directory's entry stays unread
    assert first_entry(io.BytesIO(b"\0" * 1024), 1 << 20, "usr") is None  # an empty archive: nothing there
    with pytest.raises(SandboxError, match="over"):
        first_entry(io.BytesIO(_archive(("big", b"x" * 5000, ""))), 4096, "big")


class _Response:
    """A streamed archive response as requests gives it: its status, its body in chunks, closed or not."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status_code, self.body, self.closed, self.read_bytes = status, body, False, 0

    def iter_content(self, size: int) -> Iterator[bytes]:
        for start in range(0, len(self.body), size):
            self.read_bytes += len(self.body[start : start + size])
            yield self.body[start : start + size]

    def close(self) -> None:
        self.closed = True


class _Api:
    """The low-level calls ``path_entries`` makes: the archive's GET (recorded) and the status check."""

    def __init__(self, responses: dict[str, _Response]) -> None:
        self.responses, self.asked = responses, []

    def _url(self, template: str, ident: str) -> str:
        return template.format(ident)

    def _get(self, url: str, params: dict[str, str], stream: bool, headers: dict[str, str]) -> _Response:
        self.asked.append((url, params["path"], stream, headers.get("Accept-Encoding")))
        return self.responses[params["path"]]

    def _raise_for_status(self, response: _Response) -> None:
        if response.status_code >= 400:
            raise docker.errors.APIError("500 Server Error", explanation="not a directory")


def test_a_paths_entry_is_asked_for_unencoded_and_its_response_closed_whatever_it_held() -> None:
    """The engine holds the container's lock until the archive is read or its connection closed:
    every response is closed, read or not, found or not, refused or not."""
    tree = _archive(("usr", None, ""), *((f"usr/f{i}", b"x" * 100_000, "") for i in range(40)))
    responses = {
        "/usr": _Response(200, tree),
        "/nope": _Response(404, b""),
        "/usr/lib64/x": _Response(500, b""),
        "/other": _Response(200, _archive(("else", b"x", ""))),
    }
    api = _Api(responses)
    images = TemplateImages(client=cast(docker.DockerClient, SimpleNamespace(api=api, info=dict)))
    entry = images._entry("c1", "/usr")
    assert entry is not None and entry.link is None
    assert responses["/usr"].closed and responses["/usr"].read_bytes < len(tree) // 2  # the tree unread
    assert images._entry("c1", "/nope") is None and responses["/nope"].closed
    with pytest.raises(SandboxError, match="cannot read /usr/lib64/x in the image: not a directory"):
        images._entry("c1", "/usr/lib64/x")
    assert responses["/usr/lib64/x"].closed
    with pytest.raises(SandboxError, match="begins with"):
        images._entry("c1", "/other")
    assert responses["/other"].closed
    assert api.asked[0] == ("/containers/c1/archive", "/usr", True, "identity")
