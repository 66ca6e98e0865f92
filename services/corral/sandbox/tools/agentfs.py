"""File operations done with the agent's uid: the seam between the file actions and the launcher.

The controller holds no capability and cannot act as the agent; :class:`AgentFs` is what it asks
of whoever can (the launcher's client, :class:`corral.sandbox.agent.launcher.client.LauncherClient`;
a same-uid fake in unit tests). Every method raises ``OSError(errno, strerror, filename)`` exactly
as :mod:`os` would, so callers map failures with :func:`corral.errors.os_error`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

FileType = Literal["file", "directory", "symlink", "other"]


@dataclass(frozen=True, slots=True)
class FileStat:
    """What ``stat``/``lstat`` said of one path."""

    name: str
    path: str
    type: FileType
    size: int
    mode: int
    mtime: float
    target: str | None = None  # a symlink's target


@dataclass(frozen=True, slots=True)
class DirEntry:
    """One entry of a directory listing (``lstat`` of it: a symlink is a symlink)."""

    name: str
    path: str
    type: FileType
    size: int
    mode: int
    mtime: float
    target: str | None = None


class AgentFs(Protocol):
    """File operations done with the agent's uid. Raise OSError(errno, strerror, filename) like os."""

    async def open(self, path: str, flags: int, mode: int = 0o644) -> int: ...  # an fd the caller owns
    async def stat(self, path: str, *, follow_symlinks: bool = True) -> FileStat: ...
    async def scandir(self, path: str, limit: int) -> tuple[list[DirEntry], bool]: ...  # (entries, truncated)
    async def mkdir(self, path: str, mode: int = 0o755, *, parents: bool = False) -> None: ...
    async def mkstemp(self, directory: str, prefix: str) -> tuple[int, str]: ...  # fd, path, O_EXCL, 0600
    async def rename(self, source: str, destination: str, *, replace: bool = True) -> None: ...
    async def chmod(self, path: str, mode: int) -> None: ...
    async def unlink(self, path: str) -> None: ...
    async def rmdir(self, path: str) -> None: ...
    async def rmtree(self, path: str) -> None: ...
