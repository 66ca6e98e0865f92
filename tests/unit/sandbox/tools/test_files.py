"""The file actions at the AgentFs seam (a fake of plain os calls): round trips, the all-or-nothing
write, bounded reads and listings, names that are not UTF-8, and each failure as a coded error."""

from __future__ import annotations

import asyncio
import base64
import errno
import hashlib
import os
import stat
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter

from corral.errors import ActionError, ErrorCode
from corral.protocol import actions as a
from corral.protocol.validation import validate
from corral.sandbox.tools import files
from corral.sandbox.tools.files import AgentFiles, decode_text

from ..fakefs import FakeAgentFs

ADAPTER: TypeAdapter[a.NativeAction] = TypeAdapter(a.NativeAction)


class Box:
    """A workspace in a temporary directory, the fake filesystem and the actions over both."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.fs = FakeAgentFs()
        self.files = AgentFiles(self.fs, workspace=str(root))

    async def run(self, action: dict[str, Any]) -> dict[str, Any]:
        native = validate(ADAPTER, action, "action", tagged=True)
        assert isinstance(native, a.FileAction)
        return (await self.files.run(native)).wire()

    async def fails(self, action: dict[str, Any]) -> ActionError:
        with pytest.raises(ActionError) as info:
            await self.run(action)
        return info.value

    def leftovers(self, directory: Path | None = None) -> list[str]:
        return sorted(name for name in os.listdir(directory or self.root) if name.startswith(files.TEMP_PREFIX))


@pytest.fixture
def box(tmp_path: Path) -> Box:
    return Box(tmp_path)


# -- write and read ---------------------------------------------------------------------------------------


async def test_text_round_trip_relative_to_the_workspace(box: Box) -> None:
    written = await box.run({"type": "file_write", "path": "notes.txt", "content": "héllo\n"})
    path = str(box.root / "notes.txt")
    data = "héllo\n".encode()
    assert written == {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    read = await box.run({"type": "file_read", "path": path})
    assert read == {
        "path": path,
        "content": "héllo\n",
        "encoding": "utf-8",
        "size": len(data),
        "offset": 0,
        "length": len(data),
        "eof": True,
    }
    assert box.leftovers() == []


async def test_binary_round_trip_in_base64(box: Box) -> None:
    data = bytes(range(256)) * 3
    encoded = base64.b64encode(data).decode()
    await box.run({"type": "file_write", "path": "bin", "content_base64": encoded, "mode": "0600"})
    assert (box.root / "bin").read_bytes() == data
    assert stat.S_IMODE((box.root / "bin").stat().st_mode) == 0o600
    read = await box.run({"type": "file_read", "path": "bin", "encoding": "base64"})
    assert base64.b64decode(read["content"]) == data and read["eof"] is True


async def test_a_window_of_a_file(box: Box) -> None:
    (box.root / "f").write_bytes(b"0123456789")
    read = await box.run({"type": "file_read", "path": "f", "offset": 2, "length": 3})
    assert (read["content"], read["offset"], read["length"], read["size"], read["eof"]) == ("234", 2, 3, 10, False)
    tail = await box.run({"type": "file_read", "path": "f", "offset": 8, "length": 5})
    assert (tail["content"], tail["length"], tail["eof"]) == ("89", 2, True)
    past = await box.run({"type": "file_read", "path": "f", "offset": 50})
    assert (past["content"], past["length"], past["eof"]) == ("", 0, True)


async def test_a_character_cut_by_the_window_waits_for_the_next_read(box: Box) -> None:
    (box.root / "f").write_text("aé", encoding="utf-8")  # é is two bytes: 61 c3 a9
    first = await box.run({"type": "file_read", "path": "f", "length": 2})
    assert (first["content"], first["length"], first["eof"]) == ("a", 1, False)
    rest = await box.run({"type": "file_read", "path": "f", "offset": 1})
    assert (rest["content"], rest["eof"]) == ("é", True)


async def test_bytes_that_are_not_utf8_are_refused_not_mangled(box: Box) -> None:
    (box.root / "f").write_bytes(b"ok\xff\xfe")
    error = await box.fails({"type": "file_read", "path": "f"})
    assert (error.code, error.field) == (ErrorCode.INVALID_REQUEST, "action.encoding")
    assert "base64" in error.message


def test_decode_text_refuses_a_cut_character_at_the_files_end() -> None:
    with pytest.raises(ActionError):
        decode_text("é".encode()[:1], complete=True)
    assert decode_text(b"ab\xc3", complete=False) == ("ab", 2)


async def test_text_whose_json_would_overflow_a_reply_comes_in_a_shorter_window(
    box: Box, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "MAX_TEXT_JSON", 600)
    (box.root / "f").write_text("\x01" * 1000)  # JSON writes each as \u0001: six bytes
    read = await box.run({"type": "file_read", "path": "f"})
    assert 0 < read["length"] < 100 and read["eof"] is False
    assert read["content"] == "\x01" * read["length"]


async def test_reading_a_directory_or_a_fifo(box: Box) -> None:
    (box.root / "d").mkdir()
    error = await box.fails({"type": "file_read", "path": "d"})
    assert (error.code, error.field) == (ErrorCode.IS_A_DIRECTORY, "action.path")
    os.mkfifo(box.root / "pipe")
    error = await box.fails({"type": "file_read", "path": "pipe"})  # no writer: must not block
    assert (error.code, error.field) == (ErrorCode.INVALID_REQUEST, "action.path")


async def test_missing_and_forbidden_paths(box: Box) -> None:
    error = await box.fails({"type": "file_read", "path": "/nowhere/at/all"})
    assert (error.code, error.field) == (ErrorCode.NO_SUCH_FILE, "action.path")
    assert "/nowhere/at/all" in error.message
    secret = box.root / "secret"
    secret.write_text("x")
    box.fs.denied.add(str(secret))
    error = await box.fails({"type": "file_read", "path": str(secret)})
    assert (error.code, error.field) == (ErrorCode.PERMISSION_DENIED, "action.path")


async def test_write_replaces_whole_and_keeps_the_mode_of_the_file_it_replaces(box: Box) -> None:
    target = box.root / "run.sh"
    target.write_text("old, and longer than the new content")
    target.chmod(0o755)
    inode = target.stat().st_ino
    await box.run({"type": "file_write", "path": "run.sh", "content": "new"})
    assert target.read_text() == "new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert target.stat().st_ino != inode  # a new file renamed over the old one, never rewritten in place
    assert box.fs.calls[-2:] == ["chmod", "rename"]


async def test_a_file_the_agent_may_not_write_is_refused_as_its_echo_would_be(box: Box) -> None:
    # The rename needs only the directory: the file is opened for writing as the agent first.
    target = box.root / "ro.txt"
    target.write_text("kept")
    box.fs.read_only.add(str(target))
    for action in (
        {"type": "file_write", "path": "ro.txt", "content": "new"},
        {"type": "file_write", "path": "ro.txt", "content": "more", "append": True},
    ):
        error = await box.fails(action)
        assert (error.code, error.field) == (ErrorCode.PERMISSION_DENIED, "action.path")
        assert str(target) in error.message
    assert target.read_text() == "kept" and box.leftovers() == []
    # A link as the name is what the rename replaces (the link, not its target): its target is not asked.
    os.symlink("ro.txt", box.root / "link.txt")
    await box.run({"type": "file_write", "path": "link.txt", "content": "own"})
    assert not (box.root / "link.txt").is_symlink() and (box.root / "link.txt").read_text() == "own"
    assert target.read_text() == "kept"
    # A move replaces a name, as mv does: the file's own mode is not asked.
    (box.root / "src.txt").write_text("moved")
    await box.run({"type": "file_move", "source": "src.txt", "destination": "ro.txt", "overwrite": True})
    assert target.read_text() == "moved"


async def test_append_copies_then_appends_then_renames(box: Box) -> None:
    (box.root / "log").write_text("one\n")
    out = await box.run({"type": "file_write", "path": "log", "content": "two\n", "append": True})
    assert (box.root / "log").read_text() == "one\ntwo\n"
    assert out["size"] == 8 and out["sha256"] == hashlib.sha256(b"one\ntwo\n").hexdigest()
    new = await box.run({"type": "file_write", "path": "fresh", "content": "x", "append": True})
    assert new["size"] == 1


async def test_make_dirs(box: Box) -> None:
    error = await box.fails({"type": "file_write", "path": "a/b/c.txt", "content": "x"})
    assert (error.code, error.field) == (ErrorCode.NO_SUCH_FILE, "action.path")
    # The user's path, the directory missing and the option that makes it; never the temporary file.
    target, directory = box.root / "a" / "b" / "c.txt", box.root / "a" / "b"
    assert error.message == f"'{target}': its directory {directory} does not exist (make_dirs makes it)"
    assert files.TEMP_PREFIX not in error.message
    await box.run({"type": "file_write", "path": "a/b/c.txt", "content": "x", "make_dirs": True})
    assert (box.root / "a" / "b" / "c.txt").read_text() == "x"
    await box.run({"type": "file_write", "path": "a/b/d.txt", "content": "y", "make_dirs": True})  # dirs exist
    (box.root / "plain").write_text("")
    error = await box.fails({"type": "file_write", "path": "plain/x", "content": "x", "make_dirs": True})
    assert error.code is ErrorCode.NOT_A_DIRECTORY
    assert error.message == f"'{box.root / 'plain' / 'x'}': Not a directory"


async def test_a_full_disk_leaves_nothing_half_written(box: Box) -> None:
    target = box.root / "keep.txt"
    target.write_text("the old content")
    box.fs.full = True
    error = await box.fails({"type": "file_write", "path": "keep.txt", "content": "new" * 1000})
    assert (error.code, error.field) == (ErrorCode.NO_SPACE, "action.path")
    assert target.read_text() == "the old content"
    assert box.leftovers() == []
    error = await box.fails({"type": "file_write", "path": "new.txt", "content": "x"})
    assert error.code is ErrorCode.NO_SPACE
    assert not (box.root / "new.txt").exists() and box.leftovers() == []


async def test_writing_over_a_directory_is_refused(box: Box) -> None:
    (box.root / "d").mkdir()
    error = await box.fails({"type": "file_write", "path": "d", "content": "x"})
    assert (error.code, error.field) == (ErrorCode.IS_A_DIRECTORY, "action.path")
    assert box.leftovers() == []


# -- names that are not UTF-8 -----------------------------------------------------------------------------


async def test_names_that_are_not_utf8_round_trip_through_base64(box: Box) -> None:
    raw = os.fsencode(str(box.root)) + b"/caf\xe9.txt"  # Latin-1, not UTF-8
    fd = os.open(raw, os.O_WRONLY | os.O_CREAT)
    os.write(fd, b"latin")
    os.close(fd)
    listed = await box.run({"type": "file_list", "path": str(box.root)})
    [item] = listed["entries"]
    assert item["name"] == "caf\ufffd.txt" and base64.b64decode(item["name_base64"]) == b"caf\xe9.txt"
    assert base64.b64decode(item["path_base64"]) == raw
    read = await box.run({"type": "file_read", "path_base64": item["path_base64"]})
    assert read["content"] == "latin" and base64.b64decode(read["path_base64"]) == raw
    await box.run({"type": "file_write", "path_base64": item["path_base64"], "content": "again"})
    fd = os.open(raw, os.O_RDONLY)
    assert os.read(fd, 100) == b"again"
    os.close(fd)


# -- list, stat, remove, move -----------------------------------------------------------------------------


async def _tree(root: Path) -> None:
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "a.py").write_text("a")
    (root / "src" / "pkg" / "b.py").write_text("bb")
    (root / "src" / "notes.md").write_text("")
    (root / "link").symlink_to("src/a.py")


async def test_list_one_level_sorted_with_types_and_links(box: Box) -> None:
    await _tree(box.root)
    listed = await box.run({"type": "file_list", "path": "."})
    assert listed["path"] == os.path.join(str(box.root), ".")
    assert [(e["name"], e["type"]) for e in listed["entries"]] == [("link", "symlink"), ("src", "directory")]
    link = listed["entries"][0]
    assert link["target"] == "src/a.py" and link["path"].endswith("/link")
    assert listed["truncated"] is False


async def test_list_recursive_with_a_pattern_and_a_limit(box: Box) -> None:
    await _tree(box.root)
    found = await box.run({"type": "file_list", "path": str(box.root), "recursive": True, "pattern": "*.py"})
    assert [e["path"][len(str(box.root)) :] for e in found["entries"]] == ["/src/a.py", "/src/pkg/b.py"]
    assert [e["size"] for e in found["entries"]] == [1, 2] and found["entries"][0]["mode"] == "0644"
    capped = await box.run({"type": "file_list", "path": str(box.root), "recursive": True, "limit": 2})
    assert len(capped["entries"]) == 2 and capped["truncated"] is True


async def test_list_passes_over_subdirectories_it_may_not_read(box: Box) -> None:
    await _tree(box.root)
    box.fs.denied.add(str(box.root / "src" / "pkg"))
    found = await box.run({"type": "file_list", "path": str(box.root), "recursive": True, "pattern": "*.py"})
    assert [e["name"] for e in found["entries"]] == ["a.py"]
    error = await box.fails({"type": "file_list", "path": str(box.root / "src" / "pkg")})
    assert (error.code, error.field) == (ErrorCode.PERMISSION_DENIED, "action.path")
    error = await box.fails({"type": "file_list", "path": str(box.root / "src" / "a.py")})
    assert error.code is ErrorCode.NOT_A_DIRECTORY


async def test_a_listing_scans_a_bounded_number_of_entries(box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "MAX_SCANNED", 3)
    for name in "abcde":
        (box.root / name).write_text("")
    found = await box.run({"type": "file_list", "path": ".", "pattern": "[a-e]"})
    assert len(found["entries"]) == 3 and found["truncated"] is True


async def test_stat_does_not_follow_a_symlink(box: Box) -> None:
    await _tree(box.root)
    link = await box.run({"type": "file_stat", "path": "link"})
    assert (link["type"], link["target"], link["name"]) == ("symlink", "src/a.py", "link")
    plain = await box.run({"type": "file_stat", "path": "src/pkg/b.py"})
    assert (plain["type"], plain["size"], "target" in plain) == ("file", 2, False)
    assert isinstance(plain["mtime"], float)


async def test_remove_files_and_directories(box: Box) -> None:
    await _tree(box.root)
    assert await box.run({"type": "file_remove", "path": "link"}) == {"path": str(box.root / "link"), "type": "symlink"}
    assert (box.root / "src" / "a.py").exists()  # the link went, not what it pointed at
    error = await box.fails({"type": "file_remove", "path": "src"})
    assert (error.code, error.field) == (ErrorCode.DIRECTORY_NOT_EMPTY, "action.path")
    await box.run({"type": "file_remove", "path": "src", "recursive": True})
    assert os.listdir(box.root) == []
    error = await box.fails({"type": "file_remove", "path": "src"})
    assert error.code is ErrorCode.NO_SUCH_FILE


async def test_move_and_its_overwrite_guard(box: Box) -> None:
    (box.root / "a").write_text("A")
    (box.root / "b").write_text("B")
    error = await box.fails({"type": "file_move", "source": "a", "destination": "b"})
    assert (error.code, error.field) == (ErrorCode.FILE_EXISTS, "action.destination")
    assert (box.root / "b").read_text() == "B"
    moved = await box.run({"type": "file_move", "source": "a", "destination": "b", "overwrite": True})
    assert moved == {"source": str(box.root / "a"), "destination": str(box.root / "b")}
    assert (box.root / "b").read_text() == "A" and not (box.root / "a").exists()
    error = await box.fails({"type": "file_move", "source": "a", "destination": "c"})
    assert (error.code, error.field) == (ErrorCode.NO_SUCH_FILE, "action.source")


async def test_a_move_across_filesystems_copies_a_file_then_removes_it(box: Box) -> None:
    source = box.root / "a"
    source.write_text("A")
    source.chmod(0o700)
    box.fs.cross_device = True
    error = await box.fails({"type": "file_move", "source": "a", "destination": "b"})
    assert error.code is ErrorCode.FILE_FAILED  # even the copy's own rename crosses: nothing moved
    assert source.read_text() == "A" and not (box.root / "b").exists() and box.leftovers() == []
    box.fs.cross_device = False
    real_rename = box.fs.rename
    crossed: list[str] = []

    async def rename_across_once(src: str, dst: str, *, replace: bool = True) -> None:
        if not crossed:
            crossed.append(src)
            raise OSError(18, "Invalid cross-device link", src)
        await real_rename(src, dst, replace=replace)

    box.fs.rename = rename_across_once  # type: ignore[method-assign]
    await box.run({"type": "file_move", "source": "a", "destination": "b"})
    assert (box.root / "b").read_text() == "A" and not source.exists()
    assert stat.S_IMODE((box.root / "b").stat().st_mode) == 0o700


# -- uploads ----------------------------------------------------------------------------------------------


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def test_an_upload_is_streamed_into_place(box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "CHUNK_BYTES", 4)
    parts = [b"abc", b"defgh", b"", b"ij"]
    target = box.root / "up" / "load.bin"
    written = await box.files.upload(str(target), _chunks(*parts), limit=100, mode=0o640, make_dirs=True)
    assert (written.path, written.size) == (str(target), 10)
    assert written.sha256 == hashlib.sha256(b"abcdefghij").hexdigest()
    assert target.read_bytes() == b"abcdefghij" and stat.S_IMODE(target.stat().st_mode) == 0o640


async def test_an_upload_over_the_cap_leaves_nothing(box: Box) -> None:
    (box.root / "kept").write_bytes(b"old")
    with pytest.raises(ActionError) as info:
        await box.files.upload(
            str(box.root / "kept"), _chunks(b"x" * 60, b"y" * 60), limit=100, mode=None, make_dirs=False
        )
    assert info.value.code is ErrorCode.TOO_LARGE
    assert (box.root / "kept").read_bytes() == b"old" and box.leftovers() == []


async def test_a_launcher_that_does_not_answer_is_a_file_failure_that_says_so(box: Box) -> None:
    async def gone(path: str, *, follow_symlinks: bool = True) -> None:
        raise ConnectionError("the launcher does not answer at /run/corral/launcher/sock")

    box.fs.stat = gone  # type: ignore[method-assign,assignment]
    error = await box.fails({"type": "file_stat", "path": "x"})
    assert (error.code, error.field) == (ErrorCode.FILE_FAILED, "action.path")
    assert "launcher does not answer" in error.message


async def test_a_cancelled_thread_job_is_waited_for_before_the_cancellation_passes() -> None:
    started, release = threading.Event(), threading.Event()
    finished: list[bool] = []

    def job() -> int:
        started.set()
        release.wait(10)
        finished.append(True)
        return 1

    task = asyncio.create_task(files.in_thread(job))
    await asyncio.to_thread(started.wait, 10)
    task.cancel()
    for _ in range(5):
        await asyncio.sleep(0)  # yields only: the task has seen its cancellation
    assert not task.done()  # still waiting for the thread, which still holds the fd
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished == [True]


async def test_a_directory_the_agent_may_not_write_is_named_never_the_temporary_file(
    box: Box, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def refused(directory: str, prefix: str) -> tuple[int, str]:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), f"{directory}/{prefix}abc123")

    monkeypatch.setattr(box.fs, "mkstemp", refused)
    error = await box.fails({"type": "file_write", "path": "x.txt", "content": "x"})
    assert (error.code, error.field) == (ErrorCode.PERMISSION_DENIED, "action.path")
    assert error.message == f"'{box.root / 'x.txt'}': its directory {box.root}: Read-only file system"

    async def gone(directory: str, prefix: str) -> tuple[int, str]:
        raise ConnectionError("the launcher closed its socket")

    monkeypatch.setattr(box.fs, "mkstemp", gone)
    error = await box.fails({"type": "file_write", "path": "x.txt", "content": "x"})
    assert error.code is ErrorCode.FILE_FAILED and "cannot be reached" in error.message
