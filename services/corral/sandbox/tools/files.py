"""The file actions, carried out as the agent's uid through :class:`~corral.sandbox.tools.agentfs.AgentFs`.

The controller's uid is not the agent's: it never touches an agent path with plain ``os``. It asks
the launcher to open, stat, list, rename and remove as the agent, and reads or writes only the fds
it is handed back (so big files never pass through the launcher).

A write never leaves a file half-written: the bytes go to a temporary file in the target's own
directory, which is fsynced, given its mode, and renamed over the target; on any failure (ENOSPC
included) the temporary file is removed and the target is as it was.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import fnmatch
import hashlib
import json
import os
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, assert_never

from corral.errors import ActionError, ErrorCode, os_error
from corral.protocol import actions as a
from corral.protocol import results as r
from corral.sandbox.tools.agentfs import AgentFs, DirEntry, FileStat

WORKSPACE = "/workspace"
CHUNK_BYTES = 1 << 20
TEMP_PREFIX = ".corral-write-"
# Entries looked at by one recursive listing, matching or not: a listing of / ends in bounded time.
MAX_SCANNED = 100_000
# The JSON text of a utf-8 read must fit a reply frame (16 MiB) with room for the rest of it.
MAX_TEXT_JSON = 12 << 20
_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK  # a FIFO must not block the open


@dataclass(frozen=True, slots=True)
class Written:
    """A file put in place: its path, size and the sha256 of its whole content."""

    path: str
    size: int
    sha256: str

    def result(self) -> r.FileWritten:
        path, path_base64 = named(self.path)
        return r.FileWritten(path=path, path_base64=path_base64, size=self.size, sha256=self.sha256)


# -- how paths and entries look on the wire --------------------------------------------------------------


def named(value: str) -> tuple[str, str | None]:
    """A name as the wire carries it: as text, and None; or, for a name that is not UTF-8, with
    replacement characters and its exact bytes in base64 (the ``<key>_base64`` twin: JSON cannot
    carry the bytes)."""
    raw = os.fsencode(value)
    try:
        return raw.decode(), None
    except UnicodeDecodeError:
        return raw.decode(errors="replace"), base64.b64encode(raw).decode()


def entry(item: FileStat | DirEntry) -> r.FileEntry:
    """One entry of ``file_list`` or ``file_stat``: mode as an octal string, like ``file_write`` takes it."""
    path, path_base64 = named(item.path)
    name, name_base64 = named(item.name)
    target, target_base64 = named(item.target) if item.target is not None else (None, None)
    return r.FileEntry(
        path=path,
        path_base64=path_base64,
        name=name,
        name_base64=name_base64,
        type=item.type,
        size=item.size,
        mode=f"{stat.S_IMODE(item.mode):04o}",
        mtime=item.mtime,
        target=target,
        target_base64=target_base64,
    )


def decode_text(data: bytes, complete: bool) -> tuple[str, int]:
    """``data`` as UTF-8 and how many of its bytes that is: a character cut by the end of a window
    that is not the file's end is left for the next read. Anything else that is not UTF-8 is refused."""
    try:
        return data.decode(), len(data)
    except UnicodeDecodeError as exc:
        cut_at_end = exc.reason == "unexpected end of data" and exc.end == len(data)
        if cut_at_end and not complete and exc.start > 0:
            return data[: exc.start].decode(), exc.start
        raise ActionError(
            ErrorCode.INVALID_REQUEST,
            f"the file is not UTF-8 text (byte {exc.start} of this window); read it with encoding 'base64'",
            "action.encoding",
        ) from None


def _fit_text(data: bytes, complete: bool) -> tuple[str, int]:
    """The longest UTF-8 prefix of ``data`` whose JSON text fits a reply (escapes can take 6x the bytes)."""
    text, used = decode_text(data, complete)
    while len(json.dumps(text)) > MAX_TEXT_JSON and used > 0:
        shorter = max(1, used * MAX_TEXT_JSON // len(json.dumps(text)) - 4)
        text, used = decode_text(data[:shorter], complete=False)
    return text, used


# -- plain fd work, done in a thread ---------------------------------------------------------------------

T = TypeVar("T")


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a worker thread. Cancelled meanwhile, it still waits for the thread to end
    before passing the cancellation on, so the caller's ``finally`` never closes an fd the thread is
    using (its number could be reused by then). Each call here is bounded (a chunk, a window)."""
    job = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        await asyncio.wait([job])
        raise


def read_window(fd: int, offset: int, length: int) -> bytes:
    """Up to ``length`` bytes of a regular file from ``offset`` (fewer at its end), in chunks."""
    parts: list[bytes] = []
    got = 0
    while got < length:
        part = os.pread(fd, min(CHUNK_BYTES, length - got), offset + got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class TempFile:
    """What is being written into the temporary file: its size and sha256 so far."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.size = 0
        self._digest = hashlib.sha256()

    async def write(self, data: bytes) -> None:
        self._digest.update(data)
        await in_thread(_write_all, self.fd, data)
        self.size += len(data)

    async def append_file(self, source: int) -> None:
        """The whole of ``source`` (an fd), chunk by chunk."""
        while part := await in_thread(os.read, source, CHUNK_BYTES):
            await self.write(part)

    def sha256(self) -> str:
        return self._digest.hexdigest()


Fill = Callable[[TempFile], Awaitable[None]]
FileResult = r.FileContent | r.FileWritten | r.FileListing | r.FileEntry | r.FileRemoved | r.FileMoved


class AgentFiles:
    """The file actions and the transfers, as the agent (``fs``); relative paths from ``workspace``."""

    def __init__(self, fs: AgentFs, workspace: str = WORKSPACE) -> None:
        self._fs = fs
        self._workspace = workspace

    async def stat(self, path: str) -> FileStat:
        """What ``path`` is, symlinks followed, as the agent sees it."""
        return await self._fs.stat(path)

    def resolve(self, path: str) -> str:
        """Absolute as given, else under the workspace. ``..`` stays: the agent's uid is the boundary."""
        return path if os.path.isabs(path) else os.path.join(self._workspace, path)

    async def run(self, action: a.FileAction) -> FileResult:
        """One file action's result; an OSError becomes the action's failure, blamed on the path."""
        field = _path_field(action)
        try:
            match action:
                case a.FileRead():
                    return await self._read(action)
                case a.FileWrite():
                    written = await self.write(
                        self.resolve(action.target()),
                        _fill_with(action.data()),
                        mode=action.file_mode(),
                        make_dirs=action.make_dirs,
                        keep=action.append,
                    )
                    return written.result()
                case a.FileList():
                    return await self._list(action)
                case a.FileStat():
                    return entry(await self._fs.stat(self.resolve(action.target()), follow_symlinks=False))
                case a.FileRemove():
                    return await self._remove(self.resolve(action.target()), action.recursive)
                case a.FileMove():
                    return await self._move(action)
                case _:
                    assert_never(action)
        except OSError as exc:
            if isinstance(action, a.FileMove):
                field = _move_field(action, self.resolve(action.paths()[1]), exc)
            raise file_error(exc, field) from None
        except ActionError as exc:
            if exc.field is None:
                exc.field = field
            raise

    # -- reading -----------------------------------------------------------------------------------------

    async def _read(self, action: a.FileRead) -> r.FileContent:
        path = self.resolve(action.target())
        fd = await self.open_regular(path)
        try:
            size = os.fstat(fd).st_size
            data = await in_thread(read_window, fd, action.offset, action.length)
        finally:
            os.close(fd)
        complete = len(data) < action.length or action.offset + len(data) >= size
        if action.encoding == "base64":
            content, used = base64.b64encode(data).decode(), len(data)
        else:
            content, used = _fit_text(data, complete)
        eof = complete and used == len(data)
        shown, path_base64 = named(path)
        return r.FileContent(
            path=shown,
            path_base64=path_base64,
            content=content,
            encoding=action.encoding,
            size=size,
            offset=action.offset,
            length=used,
            eof=eof,
        )

    async def open_regular(self, path: str) -> int:
        """An fd for reading ``path`` (the caller closes it); a directory or a device is refused."""
        fd = await self._fs.open(path, _READ_FLAGS)
        try:
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
            if not stat.S_ISREG(mode):
                raise ActionError(ErrorCode.INVALID_REQUEST, f"{path!r} is not a regular file")
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    # -- writing -----------------------------------------------------------------------------------------

    async def write(
        self,
        target: str,
        fill: Fill,
        *,
        mode: int | None = None,
        make_dirs: bool = False,
        keep: bool = False,
        replace: bool = True,
        as_writer: bool = True,
    ) -> Written:
        """``target`` replaced by what ``fill`` writes, all or nothing: a temporary file in the same
        directory, fsynced, given its mode (an existing file's unless ``mode``), renamed over it.
        ``keep``: the temporary file starts as a copy of the existing one (an append). ``replace=False``:
        renamed with RENAME_NOREPLACE, so a target made meanwhile fails it (FileExistsError).
        ``as_writer``: an existing target must be one the agent may write (:meth:`_writable`); a move
        (which replaces a name, as ``mv`` does) passes False."""
        directory = os.path.dirname(target) or "/"
        if make_dirs:
            await self._mkdirs(directory)
        existing = await self._existing(target)
        if existing is not None and existing.type == "file" and as_writer:
            await self._writable(target)
        fd, temp = await self._temp_in(directory, target)
        try:
            out = TempFile(fd)
            if keep and existing is not None:
                source = await self.open_regular(target)
                try:
                    await out.append_file(source)
                finally:
                    os.close(source)
            await fill(out)
            await in_thread(os.fsync, fd)
            os.close(fd)
            fd = -1
            await self._fs.chmod(temp, mode if mode is not None else _mode_of(existing))
            await self._fs.rename(temp, target, replace=replace)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            await self._discard(temp)
            raise
        return Written(target, out.size, out.sha256())

    async def _existing(self, target: str) -> FileStat | None:
        try:
            found = await self._fs.stat(target)
        except FileNotFoundError:
            return None
        if found.type == "directory":
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), target)
        return found

    async def _temp_in(self, directory: str, target: str) -> tuple[int, str]:
        """A temporary file in ``target``'s directory. Its failures name the user's path and what is
        wrong with its directory, never the temporary file's own name (which the user never gave)."""
        try:
            return await self._fs.mkstemp(directory, TEMP_PREFIX)
        except OSError as exc:
            if exc.errno is None:  # no errno: the launcher did not answer (file_error says so)
                raise
            if exc.errno == errno.ENOENT:
                reason = f"its directory {directory} does not exist (make_dirs makes it)"
            else:  # EACCES, EROFS, ENOSPC...: the directory's, as the errno says
                reason = f"its directory {directory}: {os.strerror(exc.errno)}"
            # filename2: the directory at fault, for a caller that words it its own way (the editor)
            raise OSError(exc.errno, reason, target, None, directory) from None

    async def _writable(self, target: str) -> None:
        """PermissionError unless the agent may write ``target`` itself: the rename below needs only
        the directory, so a read-only file, or another uid's, would be replaced where the agent's own
        ``echo >>`` is refused. The kernel decides, opening it for writing as the agent (its uid,
        groups, ACLs; nothing is truncated or written). O_NOFOLLOW: a symlink as the name (ELOOP) is
        what the rename replaces, the link and not its target, as ``mv`` would: nothing to ask of the
        target. What is checked can change before the rename only by the file's owner (the agent, or
        root): the agent racing itself gains nothing it could not do with ``chmod``."""
        try:
            fd = await self._fs.open(target, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return
            raise
        os.close(fd)

    async def _mkdirs(self, directory: str) -> None:
        # A file in the way fails the mkstemp that follows, with ENOTDIR.
        with contextlib.suppress(FileExistsError):
            await self._fs.mkdir(directory, 0o755, parents=True)

    async def _discard(self, temp: str) -> None:
        with contextlib.suppress(OSError):  # already gone: nothing was left behind
            await self._fs.unlink(temp)

    async def upload(
        self, target: str, body: AsyncIterator[bytes], *, limit: int, mode: int | None, make_dirs: bool
    ) -> Written:
        """A streamed body written as :meth:`write` does; more than ``limit`` bytes → ``too_large``,
        and nothing is left of it."""

        async def fill(out: TempFile) -> None:
            pending: list[bytes] = []
            held = 0
            async for chunk in body:
                if out.size + held + len(chunk) > limit:
                    raise ActionError(ErrorCode.TOO_LARGE, f"the upload is over {limit} bytes", "body")
                pending.append(chunk)
                held += len(chunk)
                if held >= CHUNK_BYTES:
                    await out.write(b"".join(pending))
                    pending, held = [], 0
            if pending:
                await out.write(b"".join(pending))

        return await self.write(target, fill, mode=mode, make_dirs=make_dirs)

    # -- listing, removing, moving -----------------------------------------------------------------------

    async def _list(self, action: a.FileList) -> r.FileListing:
        root = self.resolve(action.target())
        found, truncated = await self.listing(root, action.recursive, action.pattern, action.limit)
        path, path_base64 = named(root)
        entries = [entry(item) for item in found]
        return r.FileListing(path=path, path_base64=path_base64, entries=entries, truncated=truncated)

    async def listing(self, root: str, recursive: bool, pattern: str | None, limit: int) -> tuple[list[DirEntry], bool]:
        """Entries under ``root`` (breadth first, by name in each directory) whose name matches
        ``pattern``, at most ``limit``; symlinks are not followed; subdirectories the agent may not
        read are passed over. ``truncated`` when anything was left out."""
        out: list[DirEntry] = []
        pending = [root]
        scanned = 0
        truncated = False
        while pending:
            directory = pending.pop(0)
            if scanned >= MAX_SCANNED or len(out) >= limit:
                return out, True
            try:
                items, cut = await self._fs.scandir(directory, MAX_SCANNED - scanned)
            except OSError:
                if directory == root:
                    raise
                continue
            scanned += len(items)
            truncated |= cut
            for item in sorted(items, key=lambda found: os.fsencode(found.name)):
                if recursive and item.type == "directory":
                    pending.append(item.path)
                if pattern is not None and not fnmatch.fnmatchcase(item.name, pattern):
                    continue
                if len(out) >= limit:
                    return out, True
                out.append(item)
        return out, truncated

    async def _remove(self, path: str, recursive: bool) -> r.FileRemoved:
        found = await self._fs.stat(path, follow_symlinks=False)
        if found.type != "directory":
            await self._fs.unlink(path)
        elif recursive:
            await self._fs.rmtree(path)
        else:
            await self._fs.rmdir(path)
        shown, path_base64 = named(path)
        return r.FileRemoved(path=shown, path_base64=path_base64, type=found.type)

    async def _move(self, action: a.FileMove) -> r.FileMoved:
        source, destination = (self.resolve(path) for path in action.paths())
        try:
            await self._fs.rename(source, destination, replace=action.overwrite)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            await self._copy_across(source, destination, action.overwrite)
        (source_text, source_base64), (destination_text, destination_base64) = named(source), named(destination)
        return r.FileMoved(
            source=source_text,
            source_base64=source_base64,
            destination=destination_text,
            destination_base64=destination_base64,
        )

    async def _copy_across(self, source: str, destination: str, overwrite: bool) -> None:
        """A move to another filesystem (/workspace and the home are two tmpfs): a regular file is
        copied (all or nothing) and then removed; a directory is refused as rename refused it."""
        if not overwrite and await lexists(self._fs, destination):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), destination)
        fd = await self.open_regular(source)
        try:
            mode = stat.S_IMODE(os.fstat(fd).st_mode)

            async def fill(out: TempFile) -> None:
                await out.append_file(fd)

            await self.write(destination, fill, mode=mode, as_writer=False)
        finally:
            os.close(fd)
        await self._fs.unlink(source)


async def lexists(fs: AgentFs, path: str) -> bool:
    """Whether ``path`` names anything (a dangling symlink included), like ``os.path.lexists``."""
    try:
        await fs.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def file_error(exc: OSError, field: str) -> ActionError:
    """An OSError of a file operation as the action's failure; a launcher that does not answer
    (a ConnectionError with no errno) says so rather than naming an errno it never had."""
    if isinstance(exc, ConnectionError) and exc.errno is None:
        return ActionError(ErrorCode.FILE_FAILED, f"the agent's files cannot be reached: {exc}", field)
    return os_error(exc, field)


def _fill_with(data: bytes) -> Fill:
    async def fill(out: TempFile) -> None:
        await out.write(data)

    return fill


def _mode_of(existing: FileStat | None) -> int:
    return stat.S_IMODE(existing.mode) if existing is not None else 0o644


def _path_field(action: a.FileAction) -> str:
    if isinstance(action, a.FileMove):
        return "action.source" if action.source is not None else "action.source_base64"
    return "action.path" if action.path is not None else "action.path_base64"


def _move_field(action: a.FileMove, destination: str, exc: OSError) -> str:
    """Which of a move's paths an error is about: the destination when it is in the way or named."""
    in_the_way = exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR)
    if in_the_way or exc.filename in (destination, os.fsencode(destination)):
        return "action.destination" if action.destination is not None else "action.destination_base64"
    return _path_field(action)
