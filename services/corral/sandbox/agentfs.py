"""File operations done with the agent's uid: the seam between the controller and the launcher.

The controller runs as ``corral`` with no capability; the agent's files belong to ``agent``. Every
file action therefore asks something that can act as the agent (the launcher,
``corral.sandbox.launcher.client.LauncherClient``) to do the syscall, and gets back what ``os``
would have: an fd it then owns, a stat, a listing, or an ``OSError(errno, strerror, filename)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

FileType = Literal["file", "directory", "symlink", "other"]


@dataclass(frozen=True, slots=True)
class FileStat:
    """What ``stat``/``lstat`` says of one path."""

    name: str
    path: str
    type: FileType
    size: int
    mode: int
    mtime: float
    target: str | None = None


@dataclass(frozen=True, slots=True)
class DirEntry:
    """One entry of a directory listing (``scandir``, with its lstat)."""

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
