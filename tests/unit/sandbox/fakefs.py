"""A stand-in :class:`~corral.sandbox.tools.agentfs.AgentFs` for unit tests: plain ``os`` calls as the
test's own uid (the real one asks the launcher to act as the agent). Failures the tests need are
injected: paths the "agent" may not touch, a disk that is full, renames across filesystems."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile

from corral.sandbox.tools.agentfs import DirEntry, FileStat, FileType


def _type(mode: int) -> FileType:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def _stat(path: str, follow_symlinks: bool) -> FileStat:
    found = os.stat(path, follow_symlinks=follow_symlinks)
    target = os.readlink(path) if stat.S_ISLNK(found.st_mode) else None
    name = os.path.basename(path.rstrip("/")) or "/"
    return FileStat(name, path, _type(found.st_mode), found.st_size, found.st_mode, found.st_mtime, target)


class FakeAgentFs:
    """``denied``: paths that answer EACCES; ``read_only``: paths that answer EACCES to an open for
    writing (the tests run as root, whom a file's mode does not stop); ``full``: writes to a new
    temporary file fail with ENOSPC (its fd is /dev/full's); ``cross_device``: every rename answers EXDEV."""

    def __init__(self) -> None:
        self.denied: set[str] = set()
        self.read_only: set[str] = set()
        self.full = False
        self.cross_device = False
        self.calls: list[str] = []

    def _check(self, *paths: str) -> None:
        for path in paths:
            if path in self.denied:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)

    async def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        self.calls.append("open")
        self._check(path)
        if path in self.read_only and flags & (os.O_WRONLY | os.O_RDWR):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        return os.open(path, flags, mode)

    async def stat(self, path: str, *, follow_symlinks: bool = True) -> FileStat:
        self.calls.append("stat")
        self._check(path)
        return _stat(path, follow_symlinks)

    async def scandir(self, path: str, limit: int) -> tuple[list[DirEntry], bool]:
        self.calls.append("scandir")
        self._check(path)
        out: list[DirEntry] = []
        with os.scandir(path) as found:
            for item in found:
                if len(out) >= limit:
                    return out, True
                info = _stat(item.path, follow_symlinks=False)
                out.append(DirEntry(item.name, item.path, info.type, info.size, info.mode, info.mtime, info.target))
        return out, False

    async def mkdir(self, path: str, mode: int = 0o755, *, parents: bool = False) -> None:
        self.calls.append("mkdir")
        self._check(path)
        if parents:
            os.makedirs(path, mode, exist_ok=True)
        else:
            os.mkdir(path, mode)

    async def mkstemp(self, directory: str, prefix: str) -> tuple[int, str]:
        self.calls.append("mkstemp")
        self._check(directory)
        fd, path = tempfile.mkstemp(dir=directory, prefix=prefix)
        if self.full:
            os.close(fd)
            fd = os.open("/dev/full", os.O_WRONLY | os.O_CLOEXEC)
        return fd, path

    async def rename(self, source: str, destination: str, *, replace: bool = True) -> None:
        self.calls.append("rename")
        self._check(source, destination)
        if self.cross_device:
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), source)
        if replace:
            os.rename(source, destination)
            return
        # RENAME_NOREPLACE for files: link fails with EEXIST when the destination is there.
        os.link(source, destination, follow_symlinks=False)
        os.unlink(source)

    async def chmod(self, path: str, mode: int) -> None:
        self.calls.append("chmod")
        self._check(path)
        os.chmod(path, mode)

    async def unlink(self, path: str) -> None:
        self.calls.append("unlink")
        self._check(path)
        os.unlink(path)

    async def rmdir(self, path: str) -> None:
        self.calls.append("rmdir")
        self._check(path)
        os.rmdir(path)

    async def rmtree(self, path: str) -> None:
        self.calls.append("rmtree")
        self._check(path)
        shutil.rmtree(path)
